"""Launchers take a stored configuration when one exists and their heuristic otherwise.

Under the interpreter lookups are off unless `VASE_AUTOTUNE` is set; these tests set it,
write entries for the interpreter's device into a temporary `VASE_AUTOTUNE_DIR`, and spy
on the kernels' launches (the spy records, then launches the real kernel).
"""

from __future__ import annotations

import math
import warnings
from types import SimpleNamespace

import pytest
import torch

import vase_triton.ops
from vase_triton import reference
from vase_triton.autotune import lookup, settings, store
from vase_triton.autotune.device import profile_for
from vase_triton.autotune.shapes import AppendShape, DecodeShape, EvictShape, PrefillShape, ScoresShape
from vase_triton.autotune.spaces import SPACES
from vase_triton.cache_tensors import CacheTensors
from vase_triton.kernels import cache_append, decode_attention, eviction, prefill_attention


class Spy:
    """Stands in for a `@triton.jit` kernel: records each launch's grid and options, then launches it."""

    def __init__(self, kernel):
        self.kernel = kernel
        self.launches: list[tuple[tuple, dict]] = []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.launches.append((tuple(grid), kwargs))
            return self.kernel[grid](*args, **kwargs)

        return launch


@pytest.fixture
def store_dir(tmp_path, monkeypatch, device):
    """Lookups on (`VASE_AUTOTUNE=cached`), reading entries from an empty temporary directory."""
    monkeypatch.setenv("VASE_AUTOTUNE", "cached")
    monkeypatch.setenv("VASE_AUTOTUNE_DIR", str(tmp_path))
    monkeypatch.setattr(settings, "PACKAGED_DIRECTORY", tmp_path / "packaged")
    lookup.reset()
    yield tmp_path
    lookup.reset()


def put(directory, kernel: str, shape: tuple, params: dict, device: torch.device) -> None:
    """Store `params` as the winner of `kernel` at `shape`'s key for `device` (memoised answers dropped)."""
    space = SPACES[kernel]
    entry = store.Entry(store.Timing(params, 0.5), None, None, 1, 0, shape._asdict())
    file = store.StoreFile(directory, profile_for(device))
    file.update(lambda document: store.put_entry(document, kernel, space.source_hash(), space.key(shape), entry))
    lookup.reset()


def spy_on(monkeypatch, module, name: str) -> Spy:
    spy = Spy(getattr(module, name))
    monkeypatch.setattr(module, name, spy)
    return spy


def options(launch: tuple[tuple, dict], *names: str) -> tuple:
    return tuple(launch[1][name] for name in names)


def prefill_inputs(device):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, 20, 64, generator=gen).to(device)
    k = torch.randn(1, 2, 20, 64, generator=gen).to(device)
    v = torch.randn(1, 2, 20, 64, generator=gen).to(device)
    return q, k, v


def test_prefill_launches_take_stored_tiles_and_stay_exact(store_dir, monkeypatch, device):
    q, k, v = prefill_inputs(device)
    put(store_dir, "prefill_forward", PrefillShape(1, 4, 2, 20, 20, 64, "float32", True, True),
        dict(block_m=64, block_n=32, num_warps=8, num_stages=2), device)  # fmt: skip
    put(store_dir, "prefill_scores", ScoresShape(1, 4, 2, 4, 20, 64, "float32", True),
        dict(block_m=32, block_n=64, num_warps=8, num_stages=2), device)  # fmt: skip
    forward = spy_on(monkeypatch, prefill_attention, "_prefill_forward_kernel")
    scores_spy = spy_on(monkeypatch, prefill_attention, "_prefill_scores_kernel")
    out, lse, scores = vase_triton.ops.prefill_attention(q, k, v, score_window=4)
    assert options(forward.launches[0], "BLOCK_M", "BLOCK_N", "num_warps", "num_stages") == (64, 32, 8, 2)
    assert options(scores_spy.launches[0], "BLOCK_M", "BLOCK_N", "num_warps", "num_stages") == (32, 64, 8, 2)
    ref_out, ref_lse, ref_scores = reference.prefill_attention(q.double(), k.double(), v.double(), score_window=4)
    torch.testing.assert_close(out.double(), ref_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse.double(), ref_lse.double(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(scores.double(), ref_scores.double(), rtol=1e-5, atol=1e-5)


def test_prefill_launches_use_the_heuristic_without_an_entry(store_dir, monkeypatch, device):
    q, k, v = prefill_inputs(device)
    put(store_dir, "prefill_forward", PrefillShape(1, 4, 2, 20, 20, 64, "float16", True, True),
        dict(block_m=64, block_n=32, num_warps=8, num_stages=2), device)  # fmt: skip
    forward = spy_on(monkeypatch, prefill_attention, "_prefill_forward_kernel")
    vase_triton.ops.prefill_attention(q, k, v)
    expected = prefill_attention.forward_heuristic(PrefillShape(1, 4, 2, 20, 20, 64, "float32", True, True))
    assert options(forward.launches[0], "BLOCK_M", "BLOCK_N", "num_warps", "num_stages") == tuple(expected)


def decode_inputs(device):
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(2, 4, 1, 64, generator=gen).to(device)
    k = torch.randn(2, 2, 100, 64, generator=gen).to(device)
    v = torch.randn(2, 2, 100, 64, generator=gen).to(device)
    lens = torch.tensor([100, 37], dtype=torch.int32, device=device)
    scores = torch.rand(2, 2, 100, generator=gen).to(device)
    return q, k, v, lens, scores


DECODE_SHAPE = DecodeShape(2, 4, 2, 100, 64, "float32", True)
STORED_DECODE = dict(block_n=32, num_warps=2, num_stages=2, num_splits=3)
STORED_COMBINE = dict(block_n=64, num_warps=2)


@pytest.mark.parametrize("mode", ["cached", "off", "unset"])
def test_decode_takes_the_stored_split_plan_only_when_lookups_are_on(store_dir, monkeypatch, device, mode):
    if device.type == "cuda" and mode == "unset":
        pytest.skip("lookups default to on with CUDA; the interpreter's default is what is tested")
    if mode == "unset":
        monkeypatch.delenv("VASE_AUTOTUNE")
    else:
        monkeypatch.setenv("VASE_AUTOTUNE", mode)
    put(store_dir, "decode", DECODE_SHAPE, STORED_DECODE, device)
    put(store_dir, "decode_combine", DECODE_SHAPE, STORED_COMBINE, device)
    partial = spy_on(monkeypatch, decode_attention, "_decode_partial_kernel")
    combine = spy_on(monkeypatch, decode_attention, "_decode_combine_kernel")
    q, k, v, lens, scores = decode_inputs(device)
    expected_scores = scores.double()
    out = vase_triton.ops.decode_attention(q, k, v, lens, scores=scores)
    if mode == "cached":
        # 4 key blocks of 32 in at most 3 splits: 2 blocks per split, 2 non-empty splits.
        assert partial.launches[0][0] == (4, 2)
        assert options(partial.launches[0], "BLOCK_N", "num_warps", "num_stages") == (32, 2, 2)
        assert options(combine.launches[0], "BLOCK_N", "num_warps") == (64, 2)
    else:
        heuristic = decode_attention.decode_heuristic(DECODE_SHAPE, device)
        assert options(partial.launches[0], "BLOCK_N", "num_warps", "num_stages") == tuple(heuristic)[:3]
        assert options(combine.launches[0], "BLOCK_N", "num_warps") == tuple(decode_attention.combine_heuristic(DECODE_SHAPE))
    ref = reference.decode_attention(q.double(), k.double(), v.double(), lens, scale=0.125, scores=expected_scores)
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(scores.double(), expected_scores, rtol=1e-5, atol=1e-6)


def test_invalid_autotune_mode_is_refused(monkeypatch):
    monkeypatch.setenv("VASE_AUTOTUNE", "sometimes")
    with pytest.raises(ValueError, match="VASE_AUTOTUNE: expected one of off, cached, online; got 'sometimes'"):
        settings.autotune_mode()


def test_lookups_read_no_file_after_the_first_launch(store_dir, monkeypatch, device):
    """The decode hot path: after the first call, a lookup is a dictionary hit."""
    put(store_dir, "decode", DECODE_SHAPE, STORED_DECODE, device)
    q, k, v, lens, scores = decode_inputs(device)
    vase_triton.ops.decode_attention(q, k, v, lens, scores=scores)

    def no_io(*args, **kwargs):
        raise AssertionError("file I/O in a memoised lookup")

    monkeypatch.setattr(store.StoreFile, "read", no_io)
    monkeypatch.setattr(store.Path, "read_text", no_io)
    monkeypatch.setattr(store.Path, "stat", no_io)
    partial = spy_on(monkeypatch, decode_attention, "_decode_partial_kernel")
    for _ in range(3):
        vase_triton.ops.decode_attention(q, k, v, lens, scores=scores)
    assert [options(launch, "BLOCK_N") for launch in partial.launches] == [(32,)] * 3


@pytest.mark.parametrize(
    "params, reason",
    [
        (dict(block_n=48, num_warps=2, num_stages=2, num_splits=3), "invalid"),
        (dict(block_n=32, num_warps=2, num_stages=2), "invalid"),
        (dict(block_n=1024, num_warps=2, num_stages=8, num_splits=3), "does not fit"),
    ],
    ids=["not-a-power-of-two", "missing-parameter", "too-much-shared-memory"],
)
def test_unusable_stored_parameters_fall_back_to_the_heuristic_with_a_warning(
    store_dir, monkeypatch, device, params, reason
):
    if reason == "invalid":
        # Bypass the entry's own checks: a hand-edited file can hold anything.
        put(store_dir, "decode", DECODE_SHAPE, STORED_DECODE, device)
        path = store.StoreFile(store_dir, profile_for(device)).path
        text = path.read_text()
        if params.get("block_n") == 48:
            text = text.replace('"block_n": 32', '"block_n": 48')
        if "num_splits" not in params:
            text = text.replace('"num_splits": 3,', "")
        path.write_text(text)
    else:
        put(store_dir, "decode", DECODE_SHAPE, params, device)
    partial = spy_on(monkeypatch, decode_attention, "_decode_partial_kernel")
    q, k, v, lens, scores = decode_inputs(device)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        vase_triton.ops.decode_attention(q, k, v, lens, scores=scores)
        vase_triton.ops.decode_attention(q, k, v, lens, scores=scores)
    messages = [str(w.message) for w in caught if issubclass(w.category, store.AutotuneStoreWarning)]
    assert len(messages) == 1 and "using the heuristic" in messages[0]
    heuristic = decode_attention.decode_heuristic(DECODE_SHAPE, device)
    assert options(partial.launches[0], "BLOCK_N", "num_warps") == (heuristic.block_n, heuristic.num_warps)


def decode_with_warnings(device) -> tuple[torch.Tensor, list[str]]:
    """Two decode launches on `decode_inputs`: the output and the autotune store warnings raised."""
    q, k, v, lens, _ = decode_inputs(device)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        vase_triton.ops.decode_attention(q, k, v, lens)
        out = vase_triton.ops.decode_attention(q, k, v, lens)
    ref = reference.decode_attention(q.double(), k.double(), v.double(), lens, scale=0.125)
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    return out, [str(w.message) for w in caught if issubclass(w.category, store.AutotuneStoreWarning)]


@pytest.mark.parametrize("stored_key", ["garbage", "B=abc,C=128,H=4/2,D=64,dtype=float32,scores=0"])
def test_a_malformed_stored_key_leaves_launches_to_the_heuristic_with_one_warning(
    store_dir, monkeypatch, device, stored_key
):
    shape = DecodeShape(2, 4, 2, 100, 64, "float32", False)
    put(store_dir, "decode", shape, STORED_DECODE, device)
    path = store.StoreFile(store_dir, profile_for(device)).path
    path.write_text(path.read_text().replace(SPACES["decode"].key(shape), stored_key))
    partial = spy_on(monkeypatch, decode_attention, "_decode_partial_kernel")
    _, messages = decode_with_warnings(device)
    assert len(messages) == 1 and f"ignoring {path}" in messages[0] and repr(stored_key) in messages[0]
    heuristic = decode_attention.decode_heuristic(shape, device)
    assert [options(launch, "BLOCK_N", "num_warps") for launch in partial.launches] == [
        (heuristic.block_n, heuristic.num_warps)
    ] * 2


def test_an_unforeseen_failure_reading_stored_entries_leaves_launches_to_the_heuristic(store_dir, monkeypatch, device):
    shape = DecodeShape(2, 4, 2, 100, 64, "float32", False)
    put(store_dir, "decode", shape, STORED_DECODE, device)

    def fail(*args, **kwargs):
        raise KeyError("unforeseen")

    monkeypatch.setattr(lookup.StoreView, "find", fail)
    partial = spy_on(monkeypatch, decode_attention, "_decode_partial_kernel")
    _, messages = decode_with_warnings(device)
    assert len(messages) == 2, messages  # one per kernel: the split-K stage and the combine
    assert all("KeyError: 'unforeseen'" in message and "using the heuristic" in message for message in messages)
    heuristic = decode_attention.decode_heuristic(shape, device)
    assert [options(launch, "BLOCK_N", "num_warps") for launch in partial.launches] == [
        (heuristic.block_n, heuristic.num_warps)
    ] * 2


@pytest.mark.parametrize("setting", ["home", "file", "unreadable"])
def test_an_unusable_store_directory_leaves_launches_to_the_packaged_configs_with_one_warning(
    store_dir, monkeypatch, device, setting
):
    """No home directory to expand `~` in (as under `docker --user N`), a file given as the
    directory, or a path the system refuses to look at (a name too long, as a parent without
    permission would)."""
    shape = DecodeShape(2, 4, 2, 100, 64, "float32", False)
    packaged = settings.PACKAGED_DIRECTORY
    put(packaged, "decode", shape, STORED_DECODE, device)
    if setting == "home":
        monkeypatch.setenv("VASE_AUTOTUNE_DIR", "~vase-no-such-user/autotune")
    elif setting == "file":
        (store_dir / "a-file").write_text("")
        monkeypatch.setenv("VASE_AUTOTUNE_DIR", str(store_dir / "a-file"))
    else:
        monkeypatch.setenv("VASE_AUTOTUNE_DIR", str(store_dir / ("x" * 300)))
    lookup.reset()
    partial = spy_on(monkeypatch, decode_attention, "_decode_partial_kernel")
    _, messages = decode_with_warnings(device)
    assert len(messages) == 1
    assert messages[0].startswith("vase_triton autotune: VASE_AUTOTUNE_DIR: expected a")
    stored = (STORED_DECODE["block_n"], STORED_DECODE["num_warps"])
    assert options(partial.launches[0], "BLOCK_N", "num_warps") == stored


def make_cache(device, batch=2, heads=2, slots=40, head_dim=64, filled=40) -> CacheTensors:
    gen = torch.Generator().manual_seed(2)
    cache = CacheTensors.empty(batch, heads, slots, head_dim, dtype=torch.float32, device=device)
    cache.keys.copy_(torch.randn(cache.keys.shape, generator=gen))
    cache.values.copy_(torch.randn(cache.values.shape, generator=gen))
    cache.magnitudes.copy_(torch.rand(cache.magnitudes.shape, generator=gen))
    cache.positions.copy_(torch.arange(slots, dtype=torch.int32).expand(batch, heads, slots))
    cache.lengths.fill_(filled)
    cache.next_positions.fill_(filled)
    return cache


def test_append_takes_stored_tiles(store_dir, monkeypatch, device):
    put(store_dir, "append", AppendShape(2, 2, 3, 64, "float32"), dict(block_h=1, block_t=2, num_warps=2), device)
    spy = spy_on(monkeypatch, cache_append, "_cache_append_kernel")
    cache = make_cache(device, filled=5)
    expected = CacheTensors(*(buffer.clone() for buffer in cache))
    gen = torch.Generator().manual_seed(3)
    new_keys, new_values = (torch.randn(2, 2, 3, 64, generator=gen).to(device) for _ in range(2))
    vase_triton.ops.append_(cache, new_keys, new_values, value_stat="range")
    reference.append_(expected, new_keys, new_values, value_stat="range")
    (grid, launch_options), = spy.launches
    assert grid == (2, 2) and (launch_options["BLOCK_H"], launch_options["BLOCK_T"], launch_options["num_warps"]) == (1, 2, 2)
    for actual, wanted in zip(cache, expected):
        assert torch.equal(actual, wanted)


def test_eviction_takes_stored_selection_and_compaction_and_selects_the_same_tokens(store_dir, monkeypatch, device):
    shape = EvictShape(2, 2, 40, 24, 6, 64, "float32")
    selection = dict(budget=24, window=6, n_sink=2, n_protect=6, temperature=1.0, seed=9, trigger_length=25)
    importance = torch.rand(2, 2, 40, generator=torch.Generator().manual_seed(4)).to(device)
    heuristic_cache = make_cache(device)
    vase_triton.ops.evict_(heuristic_cache, importance, **selection)

    put(store_dir, "evict_select", shape, dict(block_r=1, num_warps=8, probes=4), device)
    put(store_dir, "evict_compact", shape, dict(block_r=1, block_m=16, block_d=32, num_warps=2), device)
    select = spy_on(monkeypatch, eviction, "_evict_select_kernel")
    compact = spy_on(monkeypatch, eviction, "_evict_compact_kernel")
    tuned_cache = make_cache(device)
    vase_triton.ops.evict_(tuned_cache, importance, **selection)
    assert select.launches[0][0] == (4,)
    assert options(select.launches[0], "BLOCK_R", "num_warps", "PROBES") == (1, 8, 4)
    assert compact.launches[0][0] == (4, 2)
    assert options(compact.launches[0], "BLOCK_R", "BLOCK_M", "BLOCK_D", "num_warps") == (1, 16, 32, 2)
    for name, actual, wanted in zip(CacheTensors._fields, tuned_cache, heuristic_cache):
        assert torch.equal(actual, wanted), name


def test_fullgraph_compiled_decode_step_uses_the_populated_store(store_dir, monkeypatch, device):
    """A decode step as the cache runs it (preallocated workspace), compiled with fullgraph=True."""
    put(store_dir, "decode", DECODE_SHAPE, STORED_DECODE, device)
    q, k, v, lens, scores = decode_inputs(device)
    workspace = vase_triton.ops.attention.decode_workspace(4, k, q.dtype, emit_scores=True)
    assert workspace[1].shape == (2, 4, 2)

    def step(q, k, v, lens, scores):
        return torch.ops.vase_triton.decode_attention(q, k, v, lens, 0.125, scores, *workspace) * 2.0

    eager_scores, compiled_scores = scores.clone(), scores.clone()
    expected = step(q, k, v, lens, eager_scores)
    partial = spy_on(monkeypatch, decode_attention, "_decode_partial_kernel")
    torch._dynamo.reset()
    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    actual = compiled(q, k, v, lens, compiled_scores)
    assert partial.launches and all(options(launch, "BLOCK_N") == (32,) for launch in partial.launches)
    torch.testing.assert_close(actual, expected, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(compiled_scores, eager_scores, rtol=1e-6, atol=1e-7)


def test_online_mode_without_cuda_tunes_nothing(store_dir, monkeypatch, device):
    if device.type == "cuda":
        pytest.skip("on CUDA online mode tunes; see the GPU test")
    monkeypatch.setenv("VASE_AUTOTUNE", "online")
    q, k, v, lens, scores = decode_inputs(device)
    vase_triton.ops.decode_attention(q, k, v, lens, scores=scores)
    assert not store.StoreFile(store_dir, profile_for(device)).path.exists()


def test_online_tuning_put_off_by_a_graph_capture_happens_at_the_next_launch(store_dir, monkeypatch):
    """A key first launched inside a CUDA graph capture is tuned at its first launch outside one."""
    from vase_triton.autotune.device import DeviceProfile

    monkeypatch.setenv("VASE_AUTOTUNE", "online")
    monkeypatch.setattr(lookup, "profile_for", lambda device: DeviceProfile("NVIDIA Fake GPU", 8, (9, 0), 227 * 1024))
    tuned = []
    monkeypatch.setattr(lookup, "_tune_online", lambda kernel, shape, device, view: tuned.append(shape) or STORED_DECODE)
    cuda = torch.device("cuda", 0)
    capturing = [True]
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing[0])
    assert lookup.tuned_params("decode", DECODE_SHAPE, cuda) is None and tuned == []
    capturing[0] = False
    assert lookup.tuned_params("decode", DECODE_SHAPE, cuda) == STORED_DECODE and tuned == [DECODE_SHAPE]
    assert lookup.tuned_params("decode", DECODE_SHAPE, cuda) == STORED_DECODE and len(tuned) == 1


def test_online_tuning_runs_on_the_launch_gpu_when_another_is_current(store_dir, monkeypatch, fake_cuda_devices):
    """The tuner's launches go to the current GPU: tuning a launch on cuda:1 makes cuda:1 current."""
    from vase_triton.autotune import tuner
    from vase_triton.autotune.device import DeviceProfile

    monkeypatch.setenv("VASE_AUTOTUNE", "online")
    monkeypatch.setattr(lookup, "profile_for", lambda device: DeviceProfile("NVIDIA Fake GPU", 8, (9, 0), 227 * 1024))
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    tuned_on = []

    def tune(kernel, shape, device, store_file):
        tuned_on.append(fake_cuda_devices.current)
        return SimpleNamespace(entry=None)

    monkeypatch.setattr(tuner, "tune", tune)
    assert lookup.tuned_params("decode", DECODE_SHAPE, torch.device("cuda", 1)) is None
    assert tuned_on == [1] and fake_cuda_devices.current == 0


@pytest.mark.gpu
def test_cuda_graph_replays_the_stored_config_and_online_mode_stores_a_new_key(store_dir, monkeypatch):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    device = torch.device("cuda", torch.cuda.current_device())
    shape = DecodeShape(2, 4, 2, 100, 64, "float16", False)
    put(store_dir, "decode", shape, STORED_DECODE, device)
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(2, 4, 1, 64, generator=gen).to(device, torch.float16)
    k, v = (torch.randn(2, 2, 100, 64, generator=gen).to(device, torch.float16) for _ in range(2))
    lens = torch.tensor([100, 37], dtype=torch.int32, device=device)
    workspace = vase_triton.ops.attention.decode_workspace(4, k, q.dtype, emit_scores=False)
    out = torch.empty_like(q)

    def step():
        out.copy_(torch.ops.vase_triton.decode_attention(q, k, v, lens, 0.125, None, *workspace))

    step()
    expected = out.clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, expected)
    ref = reference.decode_attention(q.double(), k.double(), v.double(), lens, scale=0.125)
    assert (out.double() - ref).abs().max().item() < 5e-3

    monkeypatch.setenv("VASE_AUTOTUNE", "online")
    lookup.reset()
    cache = CacheTensors.empty(2, 2, 16, 64, dtype=torch.float16, device=device)
    new = torch.randn(2, 2, 1, 64, generator=gen).to(device, torch.float16)
    vase_triton.ops.append_(cache, new, new, value_stat="range")
    document = store.StoreFile(store_dir, profile_for(device)).read()
    key = AppendShape(2, 2, 1, 64, "float16").key()
    assert key in store.entries(document, "append", SPACES["append"].source_hash())
    assert torch.equal(cache.keys[:, :, :1], new) and cache.lengths.tolist() == [1, 1]
    assert math.isfinite(store.entries(document, "append", SPACES["append"].source_hash())[key].winner.ms)
