"""Run an evaluation: every task × policy × budget × sample, one JSONL line per sample.

Work is cut into batches per (task, policy, budget): the `samples × problems` rows in
the order (sample, problem), `batch_size` rows at a time. A batch's seed depends only on
the run seed, the task and the batch index, so every policy and budget sees the same
decoding and eviction seeds for the same rows. Evictions are synchronous across a batch
(all rows evict at the same step), so a row's output can depend on its batch mates: the
same seed and batch size give the same results; a different batch size may not.

Finished samples are appended to `results.jsonl` after each batch; a rerun with the same
settings skips every batch whose samples are all recorded. `run.json` records the settings,
the model's dtype, device and weights digest, the implementation the ops run (Triton or the
PyTorch reference), and a digest of every planned batch per task: a rerun is
refused unless it would write exactly what a fresh run would, so a changed `--problems`,
`--limit` or `--samples` is accepted only when every recorded batch stays the same batch
(same rows, same index, hence the same seed), e.g. more problems with one sample and a
batch size that divides the old count.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from pathlib import Path
from typing import Iterator, Optional, Sequence

import torch

from vase_triton.backend import use_triton
from vase_triton.config import VaSEConfig
from vase_triton.eval.extraction import extract_answer, opens_reasoning
from vase_triton.eval.grading import DEFAULT_TIMEOUT_S, grade
from vase_triton.eval.prompting import render_prompt
from vase_triton.eval.tasks import Problem
from vase_triton.eval.verifier import Verifier

RESULTS_FILE = "results.jsonl"
SETTINGS_FILE = "run.json"
FULL = "full"
# Settings that only the evicting policies use: a run of the full cache alone records them as
# None, which matches any value (so it shares an output directory with evicting runs of any).
EVICTION_SETTINGS = ("window", "score_mode")
RECORD_KEYS = frozenset(("task", "id", "policy", "budget", "sample"))  # what identifies a result record


class RunError(ValueError):
    """An evaluation that cannot start; the message is one line meant for the user."""


@dataclasses.dataclass(frozen=True)
class EvalSettings:
    """The settings that decide a sample's result (recorded in `run.json` with the model's
    dtype and device and the planned batches).

    `sampling` holds the decoding overrides (`do_sample`, `temperature`, `top_p`, `top_k`)
    already merged with the model's generation config.
    """

    model: str
    max_new_tokens: int
    batch_size: int
    window: int
    seed: int
    sampling: dict
    grading_timeout_s: float = DEFAULT_TIMEOUT_S
    score_mode: str = VaSEConfig().score_mode

    def comparable(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Run:
    """One (policy, budget) cell; `budget` is None for the full cache."""

    policy: str
    budget: Optional[int]

    def config(self, settings: EvalSettings, seed: int) -> VaSEConfig:
        """The cache configuration; the full cache takes no budget or window (it is sized by the generation)."""
        if self.budget is None:
            return VaSEConfig(policy=self.policy, seed=seed, score_mode=settings.score_mode)
        return VaSEConfig(
            policy=self.policy, budget=self.budget, window=settings.window, seed=seed, score_mode=settings.score_mode
        )


def plan_runs(policies: Sequence[str], budgets: Sequence[int]) -> list[Run]:
    """`full` once (no budget), every other policy at every budget."""
    runs = [Run(FULL, None)] if FULL in policies else []
    return runs + [Run(policy, budget) for policy in policies if policy != FULL for budget in budgets]


def batch_seed(seed: int, task: str, batch_index: int) -> int:
    """A seed in `[0, 2**31)` fixed by the run seed, the task and the batch index."""
    digest = hashlib.sha256(f"{seed}/{task}/{batch_index}".encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def plan_batches(problems: Sequence[Problem], samples: int, batch_size: int) -> list[list[tuple[Problem, int]]]:
    """Rows `(problem, sample)` in the order (sample, problem), cut into batches of `batch_size`."""
    rows = [(problem, sample) for sample in range(samples) for problem in problems]
    return [rows[start : start + batch_size] for start in range(0, len(rows), batch_size)]


def sample_key(task: str, problem_id: str, policy: str, budget: Optional[int], sample: int) -> tuple:
    return (task, problem_id, policy, budget, sample)


def read_results(path: Path) -> list[dict]:
    """Complete records of a results file; a torn last line (interrupted write) is dropped from the file,
    and a complete one that lacks its newline gets it, so that the next append starts a line of its own."""
    if not path.exists():
        return []
    raw = path.read_bytes()  # bytes: a write cut inside a multi-byte character must not fail the read
    lines = [line for line in raw.split(b"\n") if line.strip()]  # "\n" only: records may hold U+2028
    records, valid_lines = [], []
    for line in lines:
        try:
            record = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            continue
        if not isinstance(record, dict) or not RECORD_KEYS <= record.keys():
            raise RunError(
                f"{path}: expected one result record per line (with {', '.join(sorted(RECORD_KEYS))}); "
                f"got {line[:80].decode('utf-8', 'replace')!r}"
            )
        records.append(record)
        valid_lines.append(line)
    if len(valid_lines) != len(lines) or (raw and not raw.endswith(b"\n")):
        path.write_bytes(b"".join(line + b"\n" for line in valid_lines))
    return records


def batch_digests(problems: Sequence[Problem], samples: int, batch_size: int) -> list[str]:
    """A digest of each planned batch's rows (problem contents and sample index), in batch order."""
    digests = []
    for batch in plan_batches(problems, samples, batch_size):
        rows = json.dumps([[dataclasses.asdict(problem), sample] for problem, sample in batch], sort_keys=True)
        digests.append(hashlib.sha256(rows.encode()).hexdigest()[:16])
    return digests


def weights_digest(model, values_per_end: int = 16) -> str:
    """A digest of every parameter's and buffer's name, shape, dtype and first and last
    `values_per_end` values: another checkpoint behind the same `--model` path changes it,
    without reading every weight. Weights may sit on several devices; offloaded ones (on the
    meta device) count by name and shape only."""
    described, values = [], []
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        described.append(f"{name}:{tuple(tensor.shape)}:{tensor.dtype}")
        if tensor.device.type != "meta":
            flat = tensor.detach().reshape(-1)
            values += [flat[:values_per_end].double().cpu(), flat[-values_per_end:].double().cpu()]
    digest = hashlib.sha256("\n".join(described).encode())
    if values:
        digest.update(torch.cat(values).numpy().tobytes())
    return digest.hexdigest()[:16]


def plan_record(
    fields: dict, problems_by_task: dict[str, list[Problem]], samples: int, *, evicting: bool = True
) -> dict:
    """The part of `run.json` known before a model loads: `fields` (settings, with `batch_size`)
    and each task's planned batches. Without `evicting` policies, `EVICTION_SETTINGS` are None."""
    tasks = {
        task: {
            "samples": samples, "problems": len(problems),
            "batches": batch_digests(problems, samples, fields["batch_size"]),
        }
        for task, problems in problems_by_task.items()
    }
    unused = {} if evicting else dict.fromkeys(EVICTION_SETTINGS)
    return {**fields, **unused, "tasks": tasks}


def run_record(
    model, settings: EvalSettings, problems_by_task: dict[str, list[Problem]], samples: int, *, evicting: bool = True
) -> dict:
    """What `run.json` holds: `plan_record` of the settings, the model's dtype, device and weights
    digest, and the implementation its ops run (`triton` or `torch`, which draw different noise)."""
    return {
        **plan_record(settings.comparable(), problems_by_task, samples, evicting=evicting),
        "dtype": str(model.dtype).removeprefix("torch."), "device": str(model.device), "weights": weights_digest(model),
        "kernels": "triton" if use_triton(model.device) else "torch",
    }


def _task_change(previous: object, current: dict) -> Optional[str]:
    """Why a task's recorded plan `previous` cannot be resumed as `current`, or None when every
    recorded batch is unchanged (a longer plan only adds batches)."""
    recorded = previous.get("batches") if isinstance(previous, dict) else None
    if isinstance(recorded, list) and current["batches"][: len(recorded)] == recorded:
        return None
    previous = previous if isinstance(previous, dict) else {}
    changes = [
        f"{field} {previous.get(field)!r} there, {current[field]!r} now"
        for field in ("problems", "samples") if previous.get(field) != current[field]
    ]
    return ", ".join(changes) + ": the recorded batches would differ" if changes else "its recorded batches would differ"


def _read_record(path: Path) -> dict:
    """The settings record at `path`, or a one-line `RunError` naming `--out`."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise RunError(f"--out: cannot read {path}: {error.strerror or error}; use another --out") from None
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise RunError(f"--out: expected {path} to hold a JSON settings record; got invalid JSON; use another --out") from None
    if not isinstance(record, dict):
        raise RunError(f"--out: expected {path} to hold a JSON object; got a {type(record).__name__}; use another --out")
    return record


def _binding_record(out_dir: Path) -> Optional[dict]:
    """The settings record that results in `out_dir` bind a run to, or None when none does.
    Settings recorded by a run that wrote no result yet bind nothing: they are replaced."""
    if out_dir.exists() and not out_dir.is_dir():
        raise RunError(f"--out: expected a directory; {out_dir} is a file")
    path, results = out_dir / SETTINGS_FILE, out_dir / RESULTS_FILE
    if not (results.exists() and results.stat().st_size > 0):
        return None
    if not path.exists():
        raise RunError(
            f"--out: {out_dir} holds results but no {SETTINGS_FILE} recording their settings; use another --out"
        )
    previous = _read_record(path)
    if not isinstance(previous.get("tasks"), dict):
        raise RunError(f"--out: expected {path} to record each task's batches; it does not; use another --out")
    return previous


def _unbound(previous: dict, record: dict) -> set[str]:
    """The eviction settings one of the two records leaves open (a run of the full cache alone)."""
    return {key for key in EVICTION_SETTINGS if record.get(key) is None or (key in previous and previous[key] is None)}


def _refuse_changes(out_dir: Path, previous: dict, record: dict) -> None:
    """Refuse `out_dir` when a field of `record` differs from `previous`, or a task's recorded batches would."""
    unbound = _unbound(previous, record)
    changed = [
        f"{key}: {repr(previous[key]) if key in previous else 'not recorded'} there, {record[key]!r} now"
        for key in sorted(record) if key != "tasks" and key not in unbound and previous.get(key) != record[key]
    ]
    for task, plan in record["tasks"].items():
        change = None if task not in previous["tasks"] else _task_change(previous["tasks"][task], plan)
        if change:
            changed.append(f"task {task!r}: {change}")
    if changed:
        detail = "; ".join(changed)
        raise RunError(f"--out: {out_dir} holds results of different settings ({detail}); use another --out")


def precheck_settings(out_dir: Path, record: dict) -> None:
    """Refuse, before a model loads, an `out_dir` whose results were run with settings other than
    `record`'s (a `plan_record`); writes nothing. `check_settings` later compares the whole record."""
    previous = _binding_record(out_dir)
    if previous is not None:
        _refuse_changes(out_dir, previous, record)


def check_settings(out_dir: Path, record: dict) -> None:
    """Record `record` (see `run_record`) in `out_dir`, or refuse a directory holding results a
    fresh run with these settings would not write."""
    path = out_dir / SETTINGS_FILE
    previous = _binding_record(out_dir)
    if previous is not None:
        _refuse_changes(out_dir, previous, record)
        bound = {key: previous.get(key) for key in _unbound(previous, record) if record.get(key) is None}
        record = {**record, **bound, "tasks": {**previous["tasks"], **record["tasks"]}}
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    except OSError as error:
        raise RunError(f"--out: cannot write {path}: {error.strerror or error}") from None


def _eos_ids(model, tokenizer) -> set[int]:
    eos = model.generation_config.eos_token_id
    ids = set(eos if isinstance(eos, (list, tuple)) else [eos] if eos is not None else [])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids


def generate_batch(model, tokenizer, prompts: Sequence[str], config: VaSEConfig, settings: EvalSettings, seed: int):
    """Generate for a left-padded batch with a fresh static cache.

    Returns `(new_ids, prompt_lengths, evictions, kv_bytes, seconds)`: `new_ids[b]` are row b's
    generated ids up to and including its end-of-sequence token.
    """
    from vase_triton.integrations.hf_cache import VaSECache
    from vase_triton.integrations.models import patched

    has_template = bool(getattr(tokenizer, "chat_template", None))
    tokenizer.padding_side = "left"  # the static cache reads prompt lengths from a left-padded mask
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    encoded = tokenizer(list(prompts), return_tensors="pt", padding=True, add_special_tokens=not has_template)
    input_ids = encoded["input_ids"].to(model.device)
    attention_mask = encoded["attention_mask"].to(model.device)
    width = input_ids.shape[1]
    eos_ids = _eos_ids(model, tokenizer)
    pad_id = tokenizer.pad_token_id
    with patched(model, config):
        cache = VaSECache.for_model(model, config, batch_size=len(prompts), max_length=width + settings.max_new_tokens)
        torch.manual_seed(seed)
        start = time.perf_counter()
        with torch.inference_mode():
            output = model.generate(
                input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=settings.max_new_tokens,
                pad_token_id=pad_id, cache=cache, **settings.sampling,
            )
        if model.device.type == "cuda":
            torch.cuda.synchronize(model.device)
        seconds = time.perf_counter() - start
    new_ids = []
    for row in output[:, width:].tolist():
        end = next((k + 1 for k, token in enumerate(row) if token in eos_ids), len(row))
        new_ids.append(row[:end])
    prompt_lengths = attention_mask.sum(dim=1).tolist()
    return new_ids, prompt_lengths, cache.n_evictions, cache.memory_bytes, seconds


def _records(
    batch, prompts, run: Run, settings: EvalSettings, batch_index: int, seed: int, generated, tokenizer, eos_ids,
    verifier: Verifier,
):
    new_ids, prompt_lengths, evictions, kv_bytes, seconds = generated
    for (problem, sample), prompt, ids, prompt_length in zip(batch, prompts, new_ids, prompt_lengths):
        text = tokenizer.decode(ids, skip_special_tokens=True)
        finished = bool(ids) and ids[-1] in eos_ids
        # A whole trace is exact only with no token between its words that the output text drops.
        trace = tokenizer.decode(ids[:-1] if finished else ids, skip_special_tokens=False)
        answer = extract_answer(text, reasoning_open=opens_reasoning(prompt))
        verdict = grade(
            answer, problem.answer, verifier=verifier, choices=problem.choices, timeout_s=settings.grading_timeout_s
        )
        yield {
            "task": problem.task, "id": problem.id, "policy": run.policy, "budget": run.budget,
            "window": None if run.budget is None else settings.window, "sample": sample, "seed": seed, "batch": batch_index,
            "batch_rows": len(batch), "prompt_tokens": int(prompt_length), "output_tokens": len(ids),
            "finished": finished, "evictions": evictions, "kv_bytes": kv_bytes,
            "answer": answer, "gold": problem.answer, "correct": verdict.correct, "grading": verdict.method,
            "trace_exact": None if problem.reference is None else trace.strip() == problem.reference.strip(),
            "seconds": round(seconds, 4), "output": text,
        }


def pending_work(
    problems_by_task: dict[str, list[Problem]], runs: Sequence[Run], samples: int, batch_size: int, done: set
) -> Iterator[tuple[str, Run, int, list]]:
    """`(task, run, batch_index, batch)` for every batch with at least one unrecorded sample."""
    for task, problems in problems_by_task.items():
        batches = plan_batches(problems, samples, batch_size)
        for run in runs:
            for index, batch in enumerate(batches):
                keys = [sample_key(task, p.id, run.policy, run.budget, s) for p, s in batch]
                if not all(key in done for key in keys):
                    yield task, run, index, batch


def run_eval(
    model, tokenizer, problems_by_task: dict[str, list[Problem]], *, policies: Sequence[str], budgets: Sequence[int],
    samples: int, settings: EvalSettings, out_dir: Path, progress: bool = True, verifier: Optional[Verifier] = None,
) -> Path:
    """Run (or resume) every pending sample; returns the path of `results.jsonl`.

    `verifier` grades the answers (the caller closes it); without one, a verifier of the run's own does.
    """
    out_dir = Path(out_dir)
    evicting = any(policy != FULL for policy in policies)
    check_settings(out_dir, run_record(model, settings, problems_by_task, samples, evicting=evicting))
    results_path = out_dir / RESULTS_FILE
    done = {
        sample_key(r["task"], r["id"], r["policy"], r["budget"], r["sample"]) for r in read_results(results_path)
    }
    runs = plan_runs(policies, budgets)
    work = list(pending_work(problems_by_task, runs, samples, settings.batch_size, done))
    total = sum(len(problems) for problems in problems_by_task.values()) * samples * len(runs)
    eos_ids = _eos_ids(model, tokenizer)
    bar = _progress_bar(total, total - sum(len(batch) for *_, batch in work), progress)
    own_verifier = verifier is None
    verifier = Verifier() if own_verifier else verifier
    try:
        for task, run, batch_index, batch in work:
            bar.set_description(f"{task} {run.policy} {run.budget or 'full'}")
            seed = batch_seed(settings.seed, task, batch_index)
            config = run.config(settings, seed)
            prompts = [render_prompt(tokenizer, problem) for problem, _ in batch]
            generated = generate_batch(model, tokenizer, prompts, config, settings, seed)
            lines = []
            records = _records(
                batch, prompts, run, settings, batch_index, seed, generated, tokenizer, eos_ids, verifier
            )
            for record in records:
                key = sample_key(task, record["id"], run.policy, run.budget, record["sample"])
                if key not in done:
                    lines.append(json.dumps(record, ensure_ascii=False) + "\n")
                    done.add(key)
            with results_path.open("a", encoding="utf-8") as handle:
                handle.writelines(lines)
            bar.update(len(batch))
    finally:
        if own_verifier:
            verifier.close()
        bar.close()
    return results_path


def planned_records(
    results_path: Path, problems_by_task: dict[str, list[Problem]], *, policies: Sequence[str],
    budgets: Sequence[int], samples: int,
) -> list[dict]:
    """The recorded samples of this run's plan; other tasks, policies or budgets in the directory are left out."""
    planned = {
        sample_key(task, problem.id, run.policy, run.budget, sample)
        for task, problems in problems_by_task.items() for problem in problems
        for run in plan_runs(policies, budgets) for sample in range(samples)
    }
    return [
        record for record in read_results(results_path)
        if sample_key(record["task"], record["id"], record["policy"], record["budget"], record["sample"]) in planned
    ]


def _progress_bar(total: int, initial: int, enabled: bool):
    """A tqdm bar with an ETA on stderr; a disabled one does nothing."""
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, unit="sample", dynamic_ncols=True, disable=not enabled)
