"""The tuner's selection: only checked candidates can win, every result is recorded, runs resume.

Runs the real tuning loop on CPU (interpreted kernels, real reference checks) with
injected timings: a fake timer gives each candidate its time, and a wrapped problem
turns chosen candidates wrong or failing.
"""

from __future__ import annotations

import pytest
import torch

from vase_triton.autotune import store, tuner
from vase_triton.autotune.device import profile_for
from vase_triton.autotune.problems import build_problem
from vase_triton.autotune.shapes import (
    AppendShape,
    DecodeShape,
    EnergyShape,
    EvictShape,
    PrefillShape,
    ScoresShape,
    SimilarityShape,
)
from vase_triton.autotune.spaces import SPACES
from vase_triton.kernels import (
    cache_append,
    decode_attention,
    eviction,
    key_similarity,
    prefill_attention,
    projected_energy,
)

APPEND = AppendShape(2, 8, 1, 128, "float32")


class Rigged:
    """A real problem whose launches, for chosen candidates, corrupt the result or raise."""

    def __init__(self, problem, wrong=(), failing=(), out_of_memory=()):
        self.problem = problem
        self.wrong = [dict(params) for params in wrong]
        self.failing = [dict(params) for params in failing]
        self.out_of_memory = [dict(params) for params in out_of_memory]
        self.launched: list[dict] = []
        self.checked: list[dict] = []
        # The problem's own check launches through the rigged launcher.
        self._real_launcher = problem.launcher
        problem.launcher = self.launcher

    def launcher(self, params):
        launch = self._real_launcher(params)
        self.launched.append(params)
        if params in self.failing:
            raise RuntimeError("out of resources: shared memory, Required: 300000, Hardware limit: 232448")
        if params in self.out_of_memory:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 256.00 MiB")
        if params not in self.wrong:
            return launch

        def corrupted() -> None:
            launch()
            outputs = getattr(self.problem, "out", None)
            (outputs if outputs is not None else self.problem.cache.keys).view(-1)[0] += 1.0

        return corrupted

    def check(self, params):
        self.checked.append(params)
        return self.problem.check(params)


def rigged_factory(holder: dict, **rigging):
    def factory(kernel, shape, device, default, partner):
        holder["problem"] = Rigged(build_problem(kernel, shape, device, default, partner), **rigging)
        return holder["problem"]

    return factory


def timer_by(times: dict[str, float], holder: dict):
    """Times each launch by its candidate, looked up in `times` (default 1 ms)."""

    def timer(launch) -> float:
        launch()
        return times.get(store.params_id(holder["problem"].launched[-1]), 1.0)

    return timer


@pytest.fixture
def store_file(tmp_path, device):
    return store.StoreFile(tmp_path, profile_for(device))


def test_a_fast_wrong_candidate_is_never_stored(store_file, device):
    default, candidates = tuner.candidate_list("append", APPEND, device)
    assert len(candidates) >= 3
    bad, good = candidates[1], candidates[2]
    holder = {}
    times = {store.params_id(bad): 0.001, store.params_id(good): 0.01}
    result = tuner.tune(
        "append", APPEND, device, store_file, timer=timer_by(times, holder),
        problem_factory=rigged_factory(holder, wrong=[bad]),
    )  # fmt: skip
    assert result.completed and result.entry.winner.params == good
    assert result.entry.rejected == 1 and result.entry.candidates == len(candidates)
    assert result.entry.default.params == default and result.entry.runner_up.ms == 1.0
    stored = store.entries(store_file.read(), "append", SPACES["append"].source_hash())[APPEND.key()]
    assert stored == result.entry and stored.winner.params != bad


def test_a_candidate_that_fails_to_launch_is_skipped(store_file, device):
    _, candidates = tuner.candidate_list("append", APPEND, device)
    failing = candidates[1]
    holder = {}
    result = tuner.tune(
        "append", APPEND, device, store_file, timer=timer_by({store.params_id(failing): 0.001}, holder),
        problem_factory=rigged_factory(holder, failing=[failing]),
    )  # fmt: skip
    assert result.entry.winner.params != failing and result.entry.rejected == 1


def _recorded(store_file, shape=APPEND) -> dict[str, dict]:
    return store.trials(store_file.read(), "append", SPACES["append"].source_hash(), shape.key(), shape._asdict())


def test_running_out_of_memory_is_not_held_against_the_candidate(store_file, device):
    """The error propagates, nothing is recorded for the candidate, and a later run times it."""
    _, candidates = tuner.candidate_list("append", APPEND, device)
    starved = candidates[1]
    holder = {}
    with pytest.raises(torch.OutOfMemoryError):
        tuner.tune("append", APPEND, device, store_file, timer=timer_by({}, holder),
                   problem_factory=rigged_factory(holder, out_of_memory=[starved]))  # fmt: skip
    assert set(_recorded(store_file)) == {store.params_id(candidates[0])}
    times = {store.params_id(starved): 0.001}
    result = tuner.tune("append", APPEND, device, store_file, timer=timer_by(times, holder),
                        problem_factory=rigged_factory(holder))  # fmt: skip
    assert result.entry.winner.params == starved and result.entry.rejected == 0


def test_a_device_that_stops_working_ends_the_tuning_after_recording_the_candidate(store_file, device, monkeypatch):
    """After a failure that leaves the device broken, no later candidate runs (each would fail for
    that reason); the failed one stays rejected and a rerun resumes past it."""
    _, candidates = tuner.candidate_list("append", APPEND, device)
    culprit = candidates[1]
    holder = {}
    monkeypatch.setattr(tuner, "_device_works", lambda _device: False)
    with pytest.raises(tuner.DeviceFailure, match=f"candidate {store.params_id(culprit)} failed"):
        tuner.tune("append", APPEND, device, store_file, timer=timer_by({}, holder),
                   problem_factory=rigged_factory(holder, failing=[culprit]))  # fmt: skip
    recorded = _recorded(store_file)
    assert set(recorded) == {store.params_id(candidates[0]), store.params_id(culprit)}
    assert "out of resources" in recorded[store.params_id(culprit)]["error"]
    monkeypatch.setattr(tuner, "_device_works", lambda _device: True)
    result = tuner.tune("append", APPEND, device, store_file, timer=timer_by({}, holder),
                        problem_factory=rigged_factory(holder))  # fmt: skip
    assert culprit not in holder["problem"].checked
    assert result.completed and result.entry.rejected == 1 and result.entry.winner.params != culprit


def test_stored_times_beyond_floats_are_not_resumed_from(store_file, device):
    """A hand-edited trial whose time no float holds is tried again, not carried into the entry."""
    _, candidates = tuner.candidate_list("append", APPEND, device)
    source_hash = SPACES["append"].source_hash()
    unusable = {"ms": 10**400}
    store_file.update(lambda doc: store.put_trial(doc, "append", source_hash, APPEND.key(), candidates[1], unusable,
                                                  APPEND._asdict()))  # fmt: skip
    holder = {}
    result = tuner.tune("append", APPEND, device, store_file, timer=timer_by({}, holder),
                        problem_factory=rigged_factory(holder))  # fmt: skip
    assert candidates[1] in holder["problem"].checked and result.entry.winner.ms == 1.0


def test_attention_outputs_off_by_more_than_rounding_are_rejected(device):
    shape = DecodeShape(2, 4, 2, 100, 64, "float32", False)
    default, candidates = tuner.candidate_list("decode", shape, device)
    partner = SPACES["decode_combine"].heuristic(shape, device)
    rigged = Rigged(build_problem("decode", shape, device, default, partner), wrong=[candidates[1]])
    assert rigged.check(candidates[2]) is None
    assert "against the float64 reference" in rigged.check(candidates[1])


def test_selection_keeps_the_fastest_checked_candidate_and_the_default_time():
    candidates = [dict(block_h=8, block_t=1, num_warps=w) for w in (4, 1, 2, 8)]
    ids = [store.params_id(params) for params in candidates]
    trials = {ids[0]: {"ms": 3.0}, ids[1]: {"error": "wrong result: cache.keys differs"}, ids[2]: {"ms": 2.0},
              ids[3]: {"ms": 2.5}}  # fmt: skip
    entry = tuner.select_entry(candidates[0], candidates, trials, APPEND)
    assert entry.winner == store.Timing(candidates[2], 2.0)
    assert entry.runner_up == store.Timing(candidates[3], 2.5)
    assert entry.default == store.Timing(candidates[0], 3.0) and entry.speedup == 1.5
    assert entry.rejected == 1 and entry.shape["new_len"] == 1
    failed_default = {**trials, ids[0]: {"error": "CompilationError"}}
    assert tuner.select_entry(candidates[0], candidates, failed_default, APPEND).default is None
    assert tuner.select_entry(candidates[0], candidates, {i: {"error": "x"} for i in ids}, APPEND) is None


def test_an_interrupted_run_resumes_with_the_remaining_candidates(store_file, device):
    _, candidates = tuner.candidate_list("append", APPEND, device)
    holder = {}
    times = {store.params_id(params): 1.0 + index for index, params in enumerate(reversed(candidates))}
    timed = []

    def interrupting_timer(launch) -> float:
        if len(timed) == 2:
            raise KeyboardInterrupt
        timed.append(holder["problem"].launched[-1])
        return timer_by(times, holder)(launch)

    with pytest.raises(KeyboardInterrupt):
        tuner.tune("append", APPEND, device, store_file, timer=interrupting_timer, problem_factory=rigged_factory(holder))
    recorded = _recorded(store_file)
    assert set(recorded) == {store.params_id(params) for params in timed}

    result = tuner.tune("append", APPEND, device, store_file, timer=timer_by(times, holder),
                        problem_factory=rigged_factory(holder))  # fmt: skip
    resumed = holder["problem"].checked
    assert [store.params_id(p) for p in resumed] == [store.params_id(p) for p in candidates[2:]]
    assert result.completed and result.entry.winner.params == candidates[-1]
    assert _recorded(store_file) == {}


def test_a_run_resumed_at_another_shape_of_the_key_times_every_candidate(store_file, device):
    """Batch 3 and batch 4 share a key: times of the interrupted batch-3 run are not the batch-4
    candidates' own, so none is reused, and the entry is of batch 4 alone."""
    interrupted, resumed = APPEND._replace(batch=3), APPEND._replace(batch=4)
    assert interrupted.key() == resumed.key()
    holder = {}

    def interrupting_timer(launch) -> float:
        if len(holder["problem"].launched) > 2:
            raise KeyboardInterrupt
        return timer_by({}, holder)(launch)

    with pytest.raises(KeyboardInterrupt):
        tuner.tune("append", interrupted, device, store_file, timer=interrupting_timer,
                   problem_factory=rigged_factory(holder))  # fmt: skip
    assert _recorded(store_file, interrupted) and not _recorded(store_file, resumed)
    _, candidates = tuner.candidate_list("append", resumed, device)
    result = tuner.tune("append", resumed, device, store_file, timer=timer_by({}, holder),
                        problem_factory=rigged_factory(holder))  # fmt: skip
    assert holder["problem"].checked == candidates
    assert result.entry.shape == resumed._asdict() and result.entry.candidates == len(candidates)


def test_a_passed_deadline_starts_no_candidate(store_file, device):
    result = tuner.tune("append", APPEND, device, store_file, timer=lambda launch: 1.0, deadline=0.0)
    assert not result.completed and result.entry is None
    assert store_file.read() is None


TINY_SHAPES = {
    "prefill_forward": PrefillShape(1, 2, 1, 20, 20, 32, "float32", True, True),
    "prefill_scores": ScoresShape(1, 2, 1, 4, 20, 32, "float32", True),
    "decode": DecodeShape(2, 2, 1, 40, 32, "float32", True),
    "decode_combine": DecodeShape(2, 2, 1, 40, 32, "float32", True),
    "append": AppendShape(2, 2, 3, 32, "float32"),
    "evict_select": EvictShape(2, 2, 40, 24, 6, 32, "float32"),
    "evict_select_tiled": EvictShape(1, 2, 40, 24, 6, 32, "float32"),
    "evict_compact": EvictShape(2, 2, 40, 24, 6, 32, "float32"),
    "projected_energy": EnergyShape(2, 2, 40, 32, 5, "float32"),
    "key_similarity": SimilarityShape(2, 2, 40, 32, "float32"),
}


def _corrupt_lse(args, kwargs, result):
    args[5].view(-1)[0] += 1.0


def _corrupt_scores(args, kwargs, result):
    args[4].view(-1)[0] += 1.0


def _corrupt_decode_output(args, kwargs, result):
    kwargs["out"].view(-1)[0] += 1.0


def _corrupt_lengths(args, kwargs, result):
    args[0].lengths[0] += 1


def _corrupt_sources(args, kwargs, result):
    sources = args[2]
    sources[0, 0] = sources[0, 1]


def _corrupt_positions(args, kwargs, result):
    args[0].positions.view(-1)[0] += 1


def _corrupt_result(args, kwargs, result):
    result.view(-1)[0] += 1.0


# The launch each problem checks, and how a deliberately wrong configuration spoils its result.
CORRUPTIONS = {
    "prefill_forward": (prefill_attention, "launch_forward", _corrupt_lse),
    "prefill_scores": (prefill_attention, "launch_scores", _corrupt_scores),
    "decode": (decode_attention, "decode_attention_triton", _corrupt_decode_output),
    "decode_combine": (decode_attention, "decode_attention_triton", _corrupt_decode_output),
    "append": (cache_append, "cache_append_triton", _corrupt_lengths),
    "evict_select": (eviction, "select_survivors_", _corrupt_sources),
    "evict_select_tiled": (eviction, "select_survivors_", _corrupt_sources),
    "evict_compact": (eviction, "compact_survivors_", _corrupt_positions),
    "projected_energy": (projected_energy, "projected_energy_triton", _corrupt_result),
    "key_similarity": (key_similarity, "mean_key_similarity_triton", _corrupt_result),
}


@pytest.mark.parametrize("kernel", list(SPACES))
def test_every_problem_accepts_the_heuristic_and_rejects_a_wrong_configuration(kernel, device, monkeypatch):
    shape = TINY_SHAPES[kernel]
    default, candidates = tuner.candidate_list(kernel, shape, device)
    wrong = next(params for params in candidates if params != default)
    partner_kernel = {"decode": "decode_combine", "decode_combine": "decode"}.get(kernel)
    partner = SPACES[partner_kernel].heuristic(shape, device) if partner_kernel else None
    problem = build_problem(kernel, shape, device, default, partner)
    assert problem.check(default) is None
    assert problem.check(wrong) is None

    module, name, corrupt = CORRUPTIONS[kernel]
    launch = getattr(module, name)

    def spoiled(*args, **kwargs):
        result = launch(*args, **kwargs)
        configs = [value for value in (*args, *kwargs.values()) if hasattr(value, "_asdict")]
        if any(config._asdict() == wrong for config in configs):
            corrupt(args, kwargs, result)
        return result

    monkeypatch.setattr(module, name, spoiled)
    assert problem.check(default) is None
    assert problem.check(wrong) is not None


def test_the_compaction_problem_moves_nearly_every_survivor(device):
    """Compaction is timed on an eviction whose holes spread over the row, as sampled evictions' do."""
    shape = EvictShape(2, 2, 264, 200, 8, 32, "float32")
    default = SPACES["evict_compact"].heuristic(shape, device)
    problem = build_problem("evict_compact", shape, device, default)
    problem.launcher(default)
    sources = problem.sources.view(shape.batch * shape.kv_heads, shape.budget).cpu()
    moved = sources != torch.arange(shape.budget, dtype=sources.dtype)
    assert moved.float().mean() > 0.9
