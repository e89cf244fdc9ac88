"""Tuning one kernel at one launch shape: try every candidate, keep the fastest correct one.

For each candidate of the pruned search space (the heuristic configuration first, always
tried, so its time is known) the tuner checks the result against the reference, then
times it; a candidate that fails to compile, runs out of resources, fails to launch or
gives a wrong result is recorded as rejected and can never win. Every result is written
to the store as soon as it is known, so an interrupted run resumes where it stopped;
when every candidate has a result, the winner, the runner-up and the default are stored
as the key's entry. Two failures are not the candidate's own and are raised instead of
recorded, so that a later run tries again: running out of memory, and a device that stops
working (a CUDA error that persists, which every later launch would meet).
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Callable, Optional

import torch

from vase_triton.autotune import store
from vase_triton.autotune.device import profile_for
from vase_triton.autotune.problems import Problem, build_problem
from vase_triton.autotune.spaces import SPACES
from vase_triton.autotune.timing import gpu_median_ms

Timer = Callable[[Callable[[], None]], float]


@dataclasses.dataclass(frozen=True)
class TuneResult:
    """What tuning one key produced.

    entry: the stored entry, None when the run stopped early or no candidate passed;
    completed: every candidate has a result; candidates: the candidate count.
    """

    kernel: str
    key: str
    source_hash: str
    entry: Optional[store.Entry]
    completed: bool
    candidates: int


def candidate_list(kernel: str, shape: tuple, device: torch.device) -> tuple[dict, list[dict]]:
    """(heuristic parameters, candidates): the pruned search space with the heuristic first."""
    space, profile = SPACES[kernel], profile_for(device)
    default = space.fitted(space.heuristic(shape, device), shape, profile)
    return default, space.tried(default, shape, profile)


class DeviceFailure(RuntimeError):
    """The device stopped working after a candidate's failure; no later result would be the candidates' own."""


def _device_works(device: torch.device) -> bool:
    """Whether `device` still runs work (a sticky CUDA error fails every later call)."""
    if device.type != "cuda":
        return True
    try:
        torch.cuda.synchronize(device)
        return torch.ones(1, device=device).sum().item() == 1
    except RuntimeError:
        return False


def _describe(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0][:200]}" if lines else type(error).__name__


def run_trial(problem: Problem, params: dict, timer: Timer) -> dict:
    """`{"ms": t}` for a candidate that gives the reference's result, else `{"error": why}`.

    Raises `torch.OutOfMemoryError`: memory is the device's state, not the candidate's fault.
    """
    # Compilation and launch failures differ by Triton version and backend (OutOfResources,
    # PTXASError, CompilationError, CUDA errors): any of them rejects the candidate only.
    try:
        wrong = problem.check(params)
    except torch.OutOfMemoryError:
        raise
    except Exception as error:
        return {"error": _describe(error)}
    if wrong is not None:
        return {"error": f"wrong result: {wrong}"}
    try:
        ms = float(timer(problem.launcher(params)))
    except torch.OutOfMemoryError:
        raise
    except Exception as error:
        return {"error": _describe(error)}
    if not (math.isfinite(ms) and ms > 0):
        return {"error": f"unusable timing: {ms} ms"}
    return {"ms": ms}


def _valid_trial(trial: object) -> bool:
    if not isinstance(trial, dict):
        return False
    if "ms" in trial:
        try:
            store.checked_ms(trial["ms"])
        except ValueError:
            return False
        return True
    return isinstance(trial.get("error"), str)


def select_entry(default: dict, candidates: list[dict], trials: dict[str, dict], shape: tuple) -> Optional[store.Entry]:
    """The entry of a finished tuning: fastest timed candidate, runner-up and default; None if none was timed.

    Only candidates that passed their check have a time, so a wrong one never wins.
    """
    timed = sorted(
        (trials[store.params_id(params)]["ms"], store.params_id(params), params)
        for params in candidates
        if "ms" in trials[store.params_id(params)]
    )
    if not timed:
        return None
    winner = store.Timing(timed[0][2], timed[0][0])
    runner_up = store.Timing(timed[1][2], timed[1][0]) if len(timed) > 1 else None
    default_trial = trials[store.params_id(default)]
    default_timing = store.Timing(default, default_trial["ms"]) if "ms" in default_trial else None
    return store.Entry(
        winner, default_timing, runner_up, candidates=len(candidates), rejected=len(candidates) - len(timed),
        shape=shape._asdict(),
    )  # fmt: skip


def _partner(kernel: str, shape: tuple, device: torch.device, document: Optional[dict]) -> Optional[dict]:
    """The other decode stage's parameters: its stored winner for this key, else its heuristic."""
    partners = {"decode": "decode_combine", "decode_combine": "decode"}
    if kernel not in partners:
        return None
    other = SPACES[partners[kernel]]
    found = store.entries(document, other.name, other.source_hash()).get(other.key(shape))
    return found.winner.params if found is not None else other.heuristic(shape, device)


def tune(
    kernel: str,
    shape: tuple,
    device: torch.device,
    store_file: store.StoreFile,
    *,
    timer: Timer = gpu_median_ms,
    deadline: Optional[float] = None,
    on_result: Optional[Callable[[int, int], None]] = None,
    problem_factory: Callable[..., Problem] = build_problem,
) -> TuneResult:
    """Tune `kernel` for a launch of `shape` on `device`, recording every result in `store_file`.

    Args:
        timer: times a launch function, in milliseconds (`gpu_median_ms` on a GPU).
        deadline: a `time.monotonic()` value after which no new candidate is started.
        on_result: called with (results known, candidates) after each candidate.
        problem_factory: builds the problem, as `build_problem` (tests inject their own).
    """
    space = SPACES[kernel]
    key, source_hash = space.key(shape), space.source_hash()
    default, candidates = candidate_list(kernel, shape, device)
    document, fields = store_file.read(), shape._asdict()
    recorded = store.trials(document, kernel, source_hash, key, fields)
    trials = {pid: trial for pid, trial in recorded.items() if _valid_trial(trial)}
    problem = None
    for params in candidates:
        pid = store.params_id(params)
        if pid not in trials:
            if deadline is not None and time.monotonic() > deadline:
                return TuneResult(kernel, key, source_hash, None, False, len(candidates))
            if problem is None:
                problem = problem_factory(kernel, shape, device, default, _partner(kernel, shape, device, document))
            result = run_trial(problem, params, timer)
            trials[pid] = result
            store_file.update(lambda doc: store.put_trial(doc, kernel, source_hash, key, params, result, fields))
            if "error" in result and not _device_works(device):
                raise DeviceFailure(
                    f"the GPU stopped working after {kernel} {key} candidate {pid} failed ({result['error']}); "
                    "that candidate is recorded as rejected: run again to resume in a new process"
                )
        if on_result is not None:
            on_result(sum(store.params_id(p) in trials for p in candidates), len(candidates))
    entry = select_entry(default, candidates, trials, shape)
    if entry is not None:
        store_file.update(lambda doc: store.put_entry(doc, kernel, source_hash, key, entry))
    return TuneResult(kernel, key, source_hash, entry, True, len(candidates))
