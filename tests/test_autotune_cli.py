"""`vase-triton autotune`: model shapes, --dry-run, the no-GPU refusal, tuning, --show and --clear.

Tuning needs a GPU; here the command's device is swapped for the interpreter and its
timer for a fake one, so the whole command (tuning, resume, table, store) runs on CPU.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from vase_triton.autotune import command, lookup, model_shapes, settings, store, timing, tuner
from vase_triton.autotune.device import DeviceProfile
from vase_triton.autotune.shapes import AppendShape, DecodeShape, EnergyShape, SimilarityShape
from vase_triton.autotune.spaces import SPACES
from vase_triton.cli import main

FAKE_GPU = DeviceProfile("NVIDIA Fake GPU", 8, (9, 0), 227 * 1024)
QWEN3_8B = {"model_type": "qwen3", "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
            "hidden_size": 4096}  # fmt: skip
TINY = {"model_type": "qwen3", "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64}


@pytest.fixture
def config_path(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(QWEN3_8B))
    return path


@pytest.fixture
def tiny_config_path(tmp_path):
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(TINY))
    return path


@pytest.fixture
def store_dir(tmp_path, monkeypatch):
    directory = tmp_path / "store"
    monkeypatch.setenv("VASE_AUTOTUNE_DIR", str(directory))
    monkeypatch.setattr(settings, "PACKAGED_DIRECTORY", tmp_path / "packaged")
    lookup.reset()
    yield directory
    lookup.reset()


@pytest.fixture
def fake_gpu(monkeypatch):
    """The command sees a GPU profile, tunes on the interpreter, and times with a fake timer."""
    monkeypatch.setattr(command, "current_cuda_profile", lambda: FAKE_GPU)
    monkeypatch.setattr(command, "_tuning_device", lambda: torch.device("cpu"))
    calls = []

    def fake_timer(launch) -> float:
        launch()
        calls.append(1)
        return 1.0 / len(calls)

    monkeypatch.setattr(timing, "gpu_median_ms", fake_timer)
    return calls


def test_model_launches_cover_decode_eviction_and_prefill_keys():
    layout = model_shapes.layout_from_config(QWEN3_8B, "test")
    launches = model_shapes.tuning_launches(
        layout, batches=[16], budgets=[4096], prompt_lens=[1024, 32768], dtypes=["bfloat16"], window=64,
        score_mode="recompute",
    )  # fmt: skip
    keys = [f"{kernel} {shape.select_key() if kernel.startswith('evict_select') else shape.key()}" for kernel, shape in launches]
    assert keys[:4] == [
        "decode B=16,C=4096,H=32/8,D=128,dtype=bfloat16,scores=0",
        "decode_combine B=16,C=4096,H=32/8,D=128,dtype=bfloat16,scores=0",
        "append B=16,T=1,H=8,D=128,dtype=bfloat16",
        "evict_select B=16,N=4096,H=8",
    ]
    assert "prefill_forward B=16,Tq=64,Tk=4096,H=32/8,D=128,dtype=bfloat16,causal=0,values=0" in keys
    # The prompt enters in chunks of 4096 (the default prefill_chunk_size); from the second
    # on, each is staged with the cache's C = 4160 slots and compressed from C + 4096.
    assert "prefill_forward B=16,Tq=4096,Tk=4096,H=32/8,D=128,dtype=bfloat16,causal=1,values=1" in keys
    assert "prefill_forward B=16,Tq=4096,Tk=8192,H=32/8,D=128,dtype=bfloat16,causal=1,values=1" in keys
    assert "evict_select B=16,N=8192,H=8" in keys and not any("Tq=32768" in key for key in keys)
    assert len(keys) == len(set(keys))
    assert ("decode", DecodeShape(16, 32, 8, 4160, 128, "bfloat16", False)) in launches
    emitted = model_shapes.tuning_launches(
        layout, batches=[1], budgets=[2048], prompt_lens=[4096], dtypes=["float16"], window=64, score_mode="emitted"
    )
    assert ("decode", DecodeShape(1, 32, 8, 2112, 128, "float16", True)) in emitted
    assert any(kernel == "prefill_scores" and shape.causal for kernel, shape in emitted)


@pytest.mark.parametrize(
    "policy, score_mode, prompt",
    [("vase", "recompute", 150), ("vase", "emitted", 150), ("vase", "emitted", 72), ("h2o", "recompute", 100),
     ("vase-dkv", "recompute", 30), ("rkv", "recompute", 130)],
)  # fmt: skip
def test_the_tuned_keys_are_the_keys_a_cache_looks_up(monkeypatch, policy, score_mode, prompt):
    """A cache's prompt (in chunks, compressed) and decode up to its first eviction look up only tuned keys."""
    from vase_triton.cache import VaSECacheLayer
    from vase_triton.config import VaSEConfig
    from vase_triton.kernels import cache_append, decode_attention, eviction, key_similarity, prefill_attention
    from vase_triton.kernels import projected_energy

    looked_up = set()

    def record(kernel, shape, device):
        looked_up.add((kernel, SPACES[kernel].key(shape)))
        return None

    for module in (cache_append, decode_attention, eviction, key_similarity, prefill_attention, projected_energy):
        monkeypatch.setattr(module, "tuned_params", record)
    budget, window, chunk = 48, 16, 40
    config = VaSEConfig(policy=policy, budget=budget, window=window, score_mode=score_mode, prefill_chunk_size=chunk)
    layer = VaSECacheLayer(config, batch_size=2, num_kv_heads=2, head_dim=32, dtype=torch.float32, device="cpu")
    generator = torch.Generator().manual_seed(0)

    def tokens(length):
        return [torch.randn(2, heads, length, 32, generator=generator) for heads in (4, 2, 2)]

    layer.prefill(*tokens(prompt), scale=32**-0.5)
    compressions = layer.n_evictions
    while layer.n_evictions == compressions:
        layer.decode(*tokens(1), scale=32**-0.5)
    tuned = {
        (kernel, SPACES[kernel].key(shape))
        for kernel, shape in model_shapes.tuning_launches(
            model_shapes.AttentionLayout(4, 2, 32, "test"), batches=[2], budgets=[budget], prompt_lens=[prompt],
            dtypes=["float32"], window=window, score_mode=score_mode, policy=policy, prefill_chunk=chunk,
        )
    }  # fmt: skip
    assert looked_up <= tuned, sorted(looked_up - tuned)
    # All the tuner adds is the split-K combine stage, which a decode this short may not launch.
    assert {kernel for kernel, _ in tuned - looked_up} <= {"decode_combine"}, sorted(tuned - looked_up)


def _kernels_of(policy: str, score_mode: str = "recompute") -> dict[str, list[tuple]]:
    layout = model_shapes.layout_from_config(QWEN3_8B, "test")
    launches = model_shapes.tuning_launches(
        layout, batches=[16], budgets=[2048], prompt_lens=[1024], dtypes=["bfloat16"], window=64,
        score_mode=score_mode, policy=policy, dkv_rank=12,
    )  # fmt: skip
    kernels: dict[str, list[tuple]] = {}
    for kernel, shape in launches:
        kernels.setdefault(kernel, []).append(shape)
    return kernels


def test_each_policy_tunes_the_importance_and_scores_its_evictions_launch():
    dkv = _kernels_of("vase-dkv")
    assert dkv["projected_energy"] == [EnergyShape(16, 8, 2112, 128, 12, "bfloat16")]
    # No observation: no recomputed window attention, no emitted scores, no prefill scores.
    assert "key_similarity" not in dkv and "prefill_scores" not in dkv
    assert all(shape.values for shape in dkv["prefill_forward"]) and not dkv["decode"][0].scores
    rkv = _kernels_of("rkv")
    assert rkv["key_similarity"] == [SimilarityShape(16, 8, 2112, 128, "bfloat16")]
    assert any(not shape.values for shape in rkv["prefill_forward"])  # the recomputed window attention
    h2o = _kernels_of("h2o")
    assert h2o["decode"][0].scores and "projected_energy" not in h2o
    assert [shape.window for shape in h2o["prefill_scores"]] == [1024]  # every prompt query
    assert [shape.window for shape in _kernels_of("tova")["prefill_scores"]] == [1]
    assert _kernels_of("vase", "emitted")["decode"][0].scores


@pytest.mark.parametrize(
    "config, fragment",
    [
        ({"num_attention_heads": 32, "num_key_value_heads": 5, "head_dim": 128}, "num_key_value_heads dividing"),
        ({"num_attention_heads": 8, "hidden_size": 8 * 96}, "head_dim in (32, 64, 128, 256); got 96"),
        ({"num_key_value_heads": 8}, "positive int num_attention_heads"),
        ({"num_attention_heads": 32, "num_key_value_heads": 0, "head_dim": 128},
         "dividing num_attention_heads = 32; got 0"),
        ({"num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128.0}, "got 128.0"),
        ({"text_config": "x", "num_attention_heads": 32}, "expected text_config to be an object; got 'x'"),
    ],
    ids=["kv-heads", "head-dim", "heads", "zero-kv-heads", "float-head-dim", "text-config-not-an-object"],
)
def test_unusable_configs_are_refused_naming_the_field(tmp_path, config, fragment, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    assert main(["autotune", "--config", str(path), "--dry-run"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and fragment in err and "--config" in err and "Traceback" not in err


def test_layout_of_a_model_directory_and_a_multimodal_config(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"text_config": {**QWEN3_8B, "head_dim": 64}}))
    layout = model_shapes.read_layout(model=str(tmp_path))
    assert (layout.q_heads, layout.kv_heads, layout.head_dim) == (32, 8, 64)


def test_dry_run_lists_the_pruned_spaces_without_a_gpu(config_path, capsys):
    argv = ["autotune", "--config", str(config_path), "--batch", "16", "--budget", "4096", "--prompt-len", "1024",
            "--kernels", "decode,evict_select", "--dry-run"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "decode B=16,C=4096,H=32/8,D=128,dtype=bfloat16,scores=0:" in out
    assert "evict_select B=16,N=4096,H=8:" in out and "prefill_forward" not in out
    assert "block_n=64,num_splits=5,num_stages=3,num_warps=4" in out
    assert "\n2 keys, " in out


def test_dry_run_without_a_gpu_lists_a_gpus_heuristic_also_under_the_interpreter(config_path, capsys):
    """On a GPU compaction moves one row per program and prefill pipelines its loads (the
    interpreter's heuristics take many rows and one stage: this suite runs under it)."""
    argv = ["autotune", "--config", str(config_path), "--batch", "16", "--budget", "4096", "--prompt-len", "1024",
            "--kernels", "evict_compact,prefill_forward", "--dry-run"]  # fmt: skip
    assert main(argv) == 0
    heuristics = [line for line in capsys.readouterr().out.splitlines() if line.endswith("(heuristic)")]
    assert len(heuristics) >= 2
    compact = [line for line in heuristics if "block_r=" in line]
    prefill = [line for line in heuristics if "num_stages=" in line]
    assert compact and all("block_r=1," in line for line in compact)
    assert prefill and all("num_stages=1," not in line for line in prefill)


def test_dry_run_lists_the_prefill_keys_of_the_prompt_chunks(config_path, capsys):
    argv = ["autotune", "--config", str(config_path), "--batch", "16", "--budget", "4096", "--prompt-len", "16384",
            "--kernels", "prefill_forward", "--dry-run"]  # fmt: skip
    assert main(argv + ["--prefill-chunk-size", "1024"]) == 0
    out = capsys.readouterr().out
    assert "prefill_forward B=16,Tq=1024,Tk=4096,H=32/8,D=128,dtype=bfloat16,causal=1,values=1:" in out
    assert "Tq=16384" not in out
    assert main(argv) == 0  # default chunks of 4096 tokens
    out = capsys.readouterr().out
    assert "prefill_forward B=16,Tq=4096,Tk=8192,H=32/8,D=128,dtype=bfloat16,causal=1,values=1:" in out
    assert "Tq=16384" not in out


def test_dry_run_of_a_policy_lists_its_importance_kernel(config_path, capsys):
    argv = ["autotune", "--config", str(config_path), "--batch", "16", "--budget", "4096", "--prompt-len", "1024",
            "--policy", "vase-dkv", "--dkv-rank", "12", "--kernels", "projected_energy", "--dry-run"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "projected_energy B=16,N=4096,H=8,D=128,R=12,dtype=bfloat16:" in out and "\n1 keys, " in out
    with pytest.raises(SystemExit):
        main(["autotune", "--config", str(config_path), "--policy", "full", "--dry-run"])
    assert "--policy: invalid choice: 'full'" in capsys.readouterr().err


def test_tuning_without_a_gpu_is_refused_in_one_line(config_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert main(["autotune", "--config", str(config_path)]) == 1
    err = capsys.readouterr().err
    assert err == "vase-triton: error: autotune: no CUDA GPU found (tune needs one); --dry-run lists the search spaces without one\n"


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["autotune", "--dry-run"], "expected --model PATH_OR_ID or --config config.json"),
        (["autotune", "--config", "missing.json", "--dry-run"], "--config missing.json: cannot read missing.json"),
        (["autotune", "--config", "c.json", "--budget", "64"], "--budget: expected values > --window = 64; got 64"),
        (["autotune", "--config", "c.json", "--kernels", "decode,flash"], "argument --kernels: expected a comma-separated"),
        (["autotune", "--config", "c.json", "--batch", "2,x"], "argument --batch: expected a comma-separated list of positive ints"),
        (["autotune", "--show", "--clear"], "not allowed with argument"),
        (["autotune", "--config", "c.json", "--time-limit", "0"], "argument --time-limit: expected a number of seconds > 0"),
        (["autotune", "--config", "c.json", "--prefill-chunk-size", "32"], "--prefill-chunk-size: expected >= --window = 64; got 32"),
        (["autotune", "--config", "c.json", "--budget", "65"], "--budget: 65 with --window 64: n_sink: expected"),
        (["autotune", "--config", "c.json", "--policy", "vase-dkv", "--dkv-rank", "2000"], "--dkv-rank: expected"),
        (["autotune", "--config", "c.json", "--dkv-rank", "7"],
         "--dkv-rank: policy 'vase' does not read dkv_rank, so --dkv-rank would be ignored"),
        (["autotune", "--config", "c.json", "--policy", "streaming", "--score-mode", "emitted"],
         "--score-mode: policy 'streaming' does not observe the window's attention"),
        (["autotune", "--model", "/no/such/model", "--dry-run"], "--model: no such directory: /no/such/model"),
        (["autotune", "--model", "~/no-such-model", "--dry-run"], "--model: no such directory: ~/no-such-model"),
        (["autotune", "--model", "org/uncached-model", "--dry-run"],
         "--model: 'org/uncached-model' is neither a local directory nor in the Hugging Face cache, and the hub is unreachable"),
    ],
    ids=["no-source", "missing-config", "budget", "kernel", "batch", "show-and-clear", "time-limit", "prefill-chunk",
         "budget-without-room-for-sinks", "dkv-rank-too-wide", "ignored-dkv-rank", "ignored-score-mode",
         "missing-directory", "missing-home-directory", "uncached-hub-id-offline"],
)
def test_bad_arguments_are_one_line_errors(argv, fragment, capsys, monkeypatch):
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    try:
        status = main(argv)
    except SystemExit as exit_info:  # argument errors exit from the parser
        status = exit_info.code
    assert status in (1, 2)
    err = capsys.readouterr().err
    assert fragment in err and err.count("\n") == 1 and "Traceback" not in err


def test_tuning_stores_a_table_resumes_and_shows(tiny_config_path, store_dir, fake_gpu, capsys):
    argv = ["autotune", "--config", str(tiny_config_path), "--batch", "2", "--budget", "128", "--prompt-len", "4",
            "--dtype", "float32", "--kernels", "append"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "tuning 2 keys on NVIDIA Fake GPU (8 SMs" in out
    rows = [line for line in out.splitlines() if line.startswith("append ")]
    assert len(rows) == 2 and all(line.rstrip().endswith("tuned") and "x " in line for line in rows)
    timed = len(fake_gpu)
    assert timed > 2

    path = store.StoreFile(store_dir, FAKE_GPU).path
    document = json.loads(path.read_text())
    keys = set(document["kernels"]["append"]["entries"])
    assert keys == {AppendShape(2, 2, 1, 64, "float32").key(), AppendShape(2, 2, 4, 64, "float32").key()}

    assert main(argv) == 0
    again = capsys.readouterr().out
    assert len(fake_gpu) == timed, "stored keys are not tuned again"
    assert [line.rstrip().endswith("stored") for line in again.splitlines() if line.startswith("append ")] == [True] * 2

    assert main(["autotune", "--show"]) == 0
    shown = capsys.readouterr().out
    assert f"user file: {path}" in shown and "packaged file:" in shown
    assert sum(line.startswith("append ") for line in shown.splitlines()) == 2

    assert main(["autotune", "--clear"]) == 0
    assert f"removed {path}" in capsys.readouterr().out and not path.exists()
    assert main(["autotune", "--clear"]) == 0
    assert "nothing stored for NVIDIA Fake GPU (8 SMs)" in capsys.readouterr().out
    assert main(["autotune", "--show"]) == 0
    assert "nothing stored" in capsys.readouterr().out


def test_a_time_limit_stops_before_the_next_key_and_a_rerun_finishes(tiny_config_path, store_dir, fake_gpu, capsys):
    argv = ["autotune", "--config", str(tiny_config_path), "--batch", "2", "--budget", "128", "--prompt-len", "4",
            "--dtype", "float32", "--kernels", "append"]  # fmt: skip
    assert main(argv + ["--time-limit", "0.000001"]) == 0
    out = capsys.readouterr().out
    assert "stopped at --time-limit 1e-06 s before append B=2,T=1," in out and "nothing tuned" in out
    assert not fake_gpu
    assert main(argv) == 0
    finished = capsys.readouterr().out
    assert "stopped" not in finished and sum(line.startswith("append ") for line in finished.splitlines()) == 2


def test_the_dry_run_lists_exactly_what_tuning_tries(tiny_config_path, store_dir, fake_gpu, monkeypatch, capsys):
    """The heuristic's configuration is always tried, also where it lies outside the pruned space
    (the interpreter's prefill heuristic has one pipeline stage, which the space does not declare)."""
    argv = ["autotune", "--config", str(tiny_config_path), "--batch", "2", "--budget", "128", "--prompt-len", "4",
            "--dtype", "float32", "--kernels", "append,prefill_forward"]  # fmt: skip
    assert main(argv + ["--dry-run"]) == 0
    listed, key = {}, None
    for line in capsys.readouterr().out.splitlines():
        if line.startswith(("append ", "prefill_forward ")):
            key = line.split(":")[0]
            listed[key] = []
        elif line.startswith("  ") and key is not None:
            listed[key].append(line.split()[0])
    tried, tune, run_trial = {}, tuner.tune, tuner.run_trial

    def tune_key(kernel, shape, *args, **kwargs):
        tried[f"{kernel} {SPACES[kernel].key(shape)}"] = []
        return tune(kernel, shape, *args, **kwargs)

    def record(problem, params, timer):
        tried[list(tried)[-1]].append(store.params_id(params))
        return run_trial(problem, params, timer)

    monkeypatch.setattr(tuner, "tune", tune_key)
    monkeypatch.setattr(tuner, "run_trial", record)
    assert main(argv) == 0
    assert tried == listed and any("num_stages=1" in params[0] for params in listed.values())


@pytest.mark.parametrize("action", [[], ["--show"], ["--clear"]])
@pytest.mark.parametrize("setting", ["file", "home", "unreadable"])
def test_an_unusable_store_directory_is_a_one_line_error(
    tiny_config_path, tmp_path, monkeypatch, fake_gpu, capsys, action, setting
):
    if setting == "file":
        (tmp_path / "file").write_text("")
        monkeypatch.setenv("VASE_AUTOTUNE_DIR", str(tmp_path / "file"))
    elif setting == "home":  # no home directory to expand `~` in, as under `docker --user N`
        monkeypatch.setenv("VASE_AUTOTUNE_DIR", "~vase-no-such-user/autotune")
    else:  # a path the system refuses to look at (as a parent without permission does)
        monkeypatch.setenv("VASE_AUTOTUNE_DIR", str(tmp_path / ("x" * 300)))
    tune = ["--config", str(tiny_config_path), "--batch", "2", "--budget", "128", "--prompt-len", "4",
            "--dtype", "float32", "--kernels", "append"]  # fmt: skip
    assert main(["autotune", *(action or tune)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("vase-triton: error: autotune: VASE_AUTOTUNE_DIR: expected a")
    assert err.count("\n") == 1 and not fake_gpu


def test_a_store_directory_that_cannot_be_made_is_a_one_line_error_before_any_candidate(
    tiny_config_path, monkeypatch, fake_gpu, capsys
):
    monkeypatch.setenv("VASE_AUTOTUNE_DIR", "/proc/vase-no-such-directory/autotune")
    argv = ["autotune", "--config", str(tiny_config_path), "--batch", "2", "--budget", "128", "--prompt-len", "4",
            "--dtype", "float32", "--kernels", "append"]  # fmt: skip
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("vase-triton: error: autotune: VASE_AUTOTUNE_DIR: expected a directory that can be made; "
                          "cannot make '/proc/vase-no-such-directory/autotune' (No such file or directory)")
    assert err.count("\n") == 1 and not fake_gpu


def test_output_piped_into_a_reader_that_stops_ends_quietly(config_path):
    """`vase-triton autotune --dry-run | head -1`: the reader closes the pipe first; no traceback."""
    process = subprocess.Popen(
        [sys.executable, "-m", "vase_triton", "autotune", "--config", str(config_path), "--dry-run"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    process.stdout.close()  # before the command's first line: its first write finds no reader
    _, err = process.communicate(timeout=300)
    assert process.returncode == 1 and err.decode() == ""


def test_show_and_clear_need_a_gpu(capsys, monkeypatch):
    monkeypatch.setattr(command, "current_cuda_profile", lambda: None)
    for action in ("--show", "--clear"):
        assert main(["autotune", action]) == 1
        assert capsys.readouterr().err == f"vase-triton: error: autotune: no CUDA GPU found ({action} needs one)\n"


def test_a_key_whose_inputs_do_not_fit_in_memory_is_skipped(tiny_config_path, store_dir, fake_gpu, monkeypatch, capsys):
    """The other keys are still tuned, and the table says which one was skipped and why."""
    tune = tuner.tune

    def tune_key(kernel, shape, *args, **kwargs):
        if shape.batch == 4:
            def no_memory(*_args, **_kwargs):
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 5.00 TiB")

            kwargs["problem_factory"] = no_memory
        return tune(kernel, shape, *args, **kwargs)

    monkeypatch.setattr(tuner, "tune", tune_key)
    argv = ["autotune", "--config", str(tiny_config_path), "--batch", "2,4", "--budget", "128", "--prompt-len", "4",
            "--dtype", "float32", "--kernels", "append"]  # fmt: skip
    assert main(argv) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("append ")]
    skipped = [row for row in rows if "B=4," in row]
    assert skipped and all(row.endswith("out of memory (its results so far are kept)  skipped") for row in skipped)
    assert any("B=2," in row and row.endswith("tuned") for row in rows)


def test_a_device_that_stops_working_ends_the_run_in_one_line_and_show_counts_the_failure(
    tiny_config_path, store_dir, fake_gpu, monkeypatch, capsys
):
    """Every launch fails and the device is found broken after the first: one line naming the
    candidate, no later candidate tried; `--show` lists the key with its one failed result."""
    monkeypatch.setattr(tuner, "_device_works", lambda _device: False)
    monkeypatch.setattr(tuner, "run_trial", lambda problem, params, timer: {"error": "RuntimeError: CUDA error"})
    argv = ["autotune", "--config", str(tiny_config_path), "--batch", "2", "--budget", "128", "--prompt-len", "4",
            "--dtype", "float32", "--kernels", "append"]  # fmt: skip
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("vase-triton: error: autotune: the GPU stopped working after append B=2,T=1,")
    assert err.count("\n") == 1 and "run again to resume in a new process" in err

    assert main(["autotune", "--show"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("append ")]
    assert len(rows) == 1 and "no entry: 1 tried, 1 failed" in rows[0]
