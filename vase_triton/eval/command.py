"""`vase-triton eval`: accuracy of policies x budgets x samples on reasoning tasks.

    vase-triton eval [--model PATH_OR_ID] [--tasks aime25,math500,...] [--policies ...] [--budgets ...] --out DIR

One JSONL line per sample (resumable), then `summary.md`, `summary.csv` and plots in
`--out`. Without `--model` the built-in testbed model is measured on held-out testbed
problems at 2x, 4x and 8x compression.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import math
import os
import sys
from pathlib import Path

from vase_triton.commands.common import (
    CommandError,
    check_backend,
    choice,
    comma_list,
    finite_float,
    is_out_of_memory,
    load_model,
    non_negative_int,
    positive_int,
    quiet_transformers,
    resolve_device,
    resolve_dtype,
    sampling_settings,
    why_ignored,
)
from vase_triton.config import SCORE_MODES, VaSEConfig
from vase_triton.policies import POLICIES

DEFAULT_WINDOW = VaSEConfig().window
MAX_GRADING_TIMEOUT_S = 86400.0
# (package, module) the evaluation needs beyond the library's own dependencies: grading and plots.
EVAL_PACKAGES = (("math-verify", "math_verify"), ("matplotlib", "matplotlib"))


def _positive_seconds(text: str) -> float:
    """An argparse type: a number of seconds in `(0, MAX_GRADING_TIMEOUT_S]`."""
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and 0 < seconds <= MAX_GRADING_TIMEOUT_S):
        raise argparse.ArgumentTypeError(
            f"expected a positive number of seconds, at most {MAX_GRADING_TIMEOUT_S:g} (a day); got {text!r}"
        )
    return seconds


def add_eval_command(commands) -> None:
    from vase_triton.eval.tasks import DEFAULT_TESTBED_PROBLEMS, HUB_TASKS

    policies = list(POLICIES)
    parser = commands.add_parser(
        "eval",
        help="measure accuracy under every policy and budget on reasoning benchmarks",
        description="Evaluate policies × budgets × samples on reasoning tasks, one JSONL line per sample "
        "(resumable), then write summary.md, summary.csv and plots into --out. Without --model, the built-in "
        "testbed model is measured on held-out testbed problems at 2x, 4x and 8x compression.",
    )
    parser.add_argument("--model", help="local path or hub id of a Qwen3 / Qwen3-MoE / Qwen2 / Llama causal LM")
    parser.add_argument(
        "--tasks", type=comma_list(str, "task names or .jsonl paths"),
        help=f"comma-separated: {', '.join(HUB_TASKS)}, testbed, or paths to .jsonl files "
        "(default: all hub tasks with --model, testbed without)",
    )
    parser.add_argument("--policies", type=comma_list(choice(policies), ", ".join(policies)), default=policies,
                        help=f"comma-separated policies (default: all of {', '.join(policies)})")
    parser.add_argument("--budgets", type=comma_list(positive_int, "positive integers"),
                        help="comma-separated budgets in tokens (default 1024,2048,4096; testbed: 2x,4x,8x)")
    parser.add_argument("--window", type=positive_int, help=f"recent/observation window (default {DEFAULT_WINDOW}; 16 for the testbed)")
    parser.add_argument("--score-mode", choices=SCORE_MODES,
                        help="window attention of vase/snapkv/rkv: recompute (the paper's, default) or emitted")
    parser.add_argument("--samples", type=positive_int, help="samples per problem (default 8; 1 for the testbed)")
    parser.add_argument("--max-new-tokens", type=positive_int, help="generation limit (default 32768)")
    parser.add_argument("--batch-size", type=positive_int, help="rows generated together (default 16; 64 for the testbed)")
    parser.add_argument("--limit", type=positive_int, help="only the first N problems of each task")
    parser.add_argument("--problems", type=positive_int,
                        help=f"problems of the testbed task to generate (default {DEFAULT_TESTBED_PROBLEMS})")
    parser.add_argument("--out", help="output directory (default: vase-eval-testbed without --model)")
    parser.add_argument("--seed", type=non_negative_int, default=0, help="run seed: decoding and eviction seeds derive from it")
    parser.add_argument("--temperature", type=finite_float(), help="override the generation config's temperature (0 = greedy)")
    parser.add_argument("--top-p", type=finite_float(0.0, 1.0), help="override the generation config's top-p")
    parser.add_argument("--top-k", type=non_negative_int, help="override the generation config's top-k")
    parser.add_argument("--grading-timeout", type=_positive_seconds, default=10.0, help="seconds allowed to grade one answer")
    parser.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (default)")
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                        help="model dtype (auto: bf16 on GPU, fp32 on CPU)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.set_defaults(handler=run_eval_command)


@dataclasses.dataclass(frozen=True)
class _EvalPlan:
    """What `vase-triton eval` runs once its defaults are filled in."""

    label: str
    tasks: list
    budgets: list
    window: int
    samples: int
    max_new_tokens: int
    batch_size: int
    out_dir: Path
    header: str


def _testbed_plan(args) -> _EvalPlan:
    from vase_triton.eval.tasks import TESTBED_TASK
    from vase_triton.testbed.harness import COMPRESSIONS, MAX_NEW_TOKENS, SEQUENCE_TOKENS, TESTBED_WINDOW, compression_budget

    budgets = args.budgets or [compression_budget(ratio) for ratio in COMPRESSIONS]
    samples, window = args.samples or 1, args.window or TESTBED_WINDOW
    ratios = ", ".join(f"{budget} ({SEQUENCE_TOKENS / budget:.1f}x)" for budget in budgets)
    return _EvalPlan(
        label="testbed", tasks=args.tasks or [TESTBED_TASK], budgets=budgets, window=window, samples=samples,
        max_new_tokens=args.max_new_tokens or MAX_NEW_TOKENS, batch_size=args.batch_size or 64,
        out_dir=Path(args.out or "vase-eval-testbed"),
        header=f"model: built-in testbed, {samples} sample(s) per problem, window {window}; "
        f"budgets {ratios} of a {SEQUENCE_TOKENS}-token sequence",
    )


def _model_plan(args) -> _EvalPlan:
    from vase_triton.eval.tasks import HUB_TASKS

    if args.out is None:
        raise CommandError("--out: expected an output directory for results of --model")
    samples, window = args.samples or 8, args.window or DEFAULT_WINDOW
    # A local directory is recorded in one spelling, so that `md`, `./md` and `md/` resume one run.
    label = os.path.normpath(args.model) if os.path.isdir(args.model) else args.model
    return _EvalPlan(
        label=label, tasks=args.tasks or list(HUB_TASKS), budgets=args.budgets or [1024, 2048, 4096],
        window=window, samples=samples, max_new_tokens=args.max_new_tokens or 32768,
        batch_size=args.batch_size or 16, out_dir=Path(args.out),
        header=f"model: {args.model}, {samples} sample(s) per problem, window {window}",
    )


def run_eval_command(args) -> int:
    from vase_triton.eval.runner import FULL, RunError, plan_record, precheck_settings
    from vase_triton.eval.summary import AVERAGE
    from vase_triton.eval.tasks import DEFAULT_TESTBED_PROBLEMS, TESTBED_TASK, TaskError, load_task, task_label
    from vase_triton.eval.verifier import Verifier, VerifierStartError

    device = resolve_device(args.device)
    check_backend(device)
    dtype = resolve_dtype(args.dtype, device)
    plan = _testbed_plan(args) if args.model is None else _model_plan(args)
    if all(policy == FULL for policy in args.policies):
        for option, given in (("--budgets", args.budgets), ("--window", args.window)):
            if given is not None:
                raise CommandError(f"{option}: only the evicting policies use it, and --policies runs 'full' alone; "
                                   f"drop {option}")
    if args.score_mode is not None and all(why_ignored("score_mode", POLICIES[p], None) for p in args.policies):
        raise CommandError("--score-mode: none of --policies observes the window's attention; drop --score-mode")
    if args.problems is not None and TESTBED_TASK not in plan.tasks:
        raise CommandError(f"--problems: only the {TESTBED_TASK!r} task uses it, and --tasks has none; drop --problems")
    score_mode = args.score_mode or VaSEConfig().score_mode
    for policy in args.policies:
        if policy == FULL:  # no budget or window (`runner.Run.config`)
            continue
        for budget in plan.budgets:
            try:
                VaSEConfig(policy=policy, budget=budget, window=plan.window, score_mode=score_mode)
            except (ValueError, TypeError) as error:
                given = f"--budgets: {budget}" if args.window is None else f"--budgets/--window: {budget}/{plan.window}"
                raise CommandError(f"{given} with {policy!r}: {error}") from None
    missing = [package for package, module in EVAL_PACKAGES if importlib.util.find_spec(module) is None]
    if missing:
        raise CommandError(
            f"eval: needs {' and '.join(missing)} (grading and plots), not installed; pip install 'vase-triton[eval]'"
        )
    labels = {}
    for task in plan.tasks:
        label = task_label(task)
        if label == AVERAGE:
            raise CommandError(f"--tasks: {task!r} would be recorded as {AVERAGE!r}, the summary's mean over tasks; "
                               "rename it")
        if labels.setdefault(label, task) != task:
            raise CommandError(
                f"--tasks: expected tasks recorded under distinct names; {labels[label]!r} and {task!r} are both {label!r}"
            )
    try:
        problems = {
            label: load_task(task, limit=args.limit, testbed_problems=args.problems or DEFAULT_TESTBED_PROBLEMS)
            for label, task in labels.items()
        }
    except TaskError as error:
        raise CommandError(str(error)) from None
    fields = dict(
        model=plan.label, max_new_tokens=plan.max_new_tokens, batch_size=plan.batch_size, window=plan.window,
        seed=args.seed, grading_timeout_s=args.grading_timeout, score_mode=score_mode,
    )  # fmt: skip
    evicting = any(policy != FULL for policy in args.policies)
    try:  # before the model loads: a refused --out should not wait for a checkpoint
        precheck_settings(plan.out_dir, plan_record(fields, problems, plan.samples, evicting=evicting))
    except RunError as error:
        raise CommandError(str(error)) from None
    with Verifier() as verifier:
        try:
            verifier.start()  # before the model loads: an installed math-verify may still fail to import
        except VerifierStartError as error:
            raise CommandError(f"eval: {error}") from None
        return _evaluate(args, plan, problems, fields, device, dtype, verifier)


def _evaluate(args, plan: _EvalPlan, problems: dict, fields: dict, device, dtype, verifier) -> int:
    """Load the model, run or resume the plan with the settings `fields` and the model's
    sampling, grading with `verifier`, and print the summary."""
    from vase_triton.eval.runner import EvalSettings, RunError, planned_records, run_eval
    from vase_triton.eval.summary import markdown_table, write_summary
    from vase_triton.eval.verifier import MEMORY_LIMIT_BYTES, Overrun, VerifierStartError

    if args.model is None:
        from vase_triton.testbed.model import load_testbed

        quiet_transformers()
        try:
            model, tokenizer = load_testbed(device=device, dtype=dtype)
        except FileNotFoundError as error:
            raise CommandError(str(error)) from None
    else:
        model, tokenizer = load_model(args.model, device, dtype)
    settings = EvalSettings(**fields, sampling=sampling_settings(model, args.temperature, args.top_p, args.top_k))
    try:
        results = run_eval(
            model, tokenizer, problems, policies=args.policies, budgets=plan.budgets, samples=plan.samples,
            settings=settings, out_dir=plan.out_dir, progress=not args.no_progress, verifier=verifier,
        )
    except RunError as error:
        raise CommandError(str(error)) from None
    except VerifierStartError as error:
        raise CommandError(f"eval: {error}; finished batches are kept in {plan.out_dir}") from None
    except RuntimeError as error:  # torch.OutOfMemoryError included
        if not is_out_of_memory(error):
            raise
        raise CommandError(
            f"eval: out of memory on {device} at --batch-size {plan.batch_size}, --max-new-tokens {plan.max_new_tokens}; "
            f"finished batches are kept in {plan.out_dir}, but smaller settings need another --out"
        ) from None
    records = planned_records(results, problems, policies=args.policies, budgets=plan.budgets, samples=plan.samples)
    cells, written = write_summary(records, plan.out_dir, plan.header)
    print(markdown_table(cells, "accuracy", "Accuracy (%), mean ± standard error over samples"))
    if any(cell.trace_exact is not None for cell in cells):
        print(markdown_table(cells, "trace_exact", "Whole-trace exact match (%)"))
    print(f"results: {results}; summary: {plan.out_dir / written[0]} (+ {', '.join(written[1:])})")
    limits = {
        Overrun.TIME: f"--grading-timeout {args.grading_timeout:g} s",
        Overrun.MEMORY: f"the grading process's {MEMORY_LIMIT_BYTES / 2**30:g} GiB",
    }
    for overrun, limit in limits.items():
        overran = sum(record["grading"] == overrun.value for record in records)
        if overran:
            print(f"note: {overran} of {len(records)} answers could not be graded within {limit} and count as "
                  f"wrong (their records say \"grading\": \"{overrun.value}\")", file=sys.stderr)  # fmt: skip
    return 0
