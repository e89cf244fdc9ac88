"""The `vase-triton` command (also `python -m vase_triton`).

    vase-triton generate [--model PATH_OR_ID] [--prompt TEXT] [--policy vase] [--budget N] ...
    vase-triton eval [--model PATH_OR_ID] [--tasks ...] [--policies ...] [--budgets ...] ...

Without `--model` both run the built-in testbed model (no download): `generate` solves
one testbed problem with the full cache and with the chosen policy side by side, `eval`
measures every policy at 2x, 4x and 8x compression. Errors print one line to stderr and
exit non-zero.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

import torch

from vase_triton.config import POLICIES, VALUE_STATS, VaSEConfig

DEFAULT_PROMPT = "Question: Natalia sold 48 clips in April and half as many in May. How many clips in total?\nAnswer:"
DEFAULT_BUDGET, DEFAULT_WINDOW, DEFAULT_MAX_NEW_TOKENS = 2048, 64, 1024
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class CommandError(Exception):
    """A user-facing failure: printed as one line, exit status 1."""


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer; got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer; got {value}")
    return value


def _int_list(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers; got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers; got {text!r}")
    return values


def _name_list(choices: Sequence[str]):
    def parse(text: str) -> list[str]:
        names = [part.strip() for part in text.split(",") if part.strip()]
        unknown = [name for name in names if name not in choices]
        if not names or unknown:
            raise argparse.ArgumentTypeError(
                f"expected comma-separated names from {', '.join(choices)}; got {text!r}"
            )
        return list(dict.fromkeys(names))

    return parse


def _task_list(text: str) -> list[str]:
    names = [part.strip() for part in text.split(",") if part.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"expected comma-separated task names or .jsonl paths; got {text!r}")
    return list(dict.fromkeys(names))


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 0; got {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0; got {value}")
    return value


class _OneLineErrorParser(argparse.ArgumentParser):
    """Argument errors print one line (`vase-triton: error: ...`) and exit with status 2."""

    def error(self, message: str):
        self.exit(2, f"vase-triton: error: {message} (see '{self.prog} --help')\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _OneLineErrorParser(
        prog="vase-triton",
        description="Run reasoning models with a fixed-size VaSE KV cache.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True

    generate = commands.add_parser(
        "generate",
        help="generate text with a VaSE-patched model and report speed and KV memory",
        description="Generate a completion with a VaSE-patched model. Without --model, the built-in testbed "
        "model (no download) solves a held-out testbed problem with the full cache and with --policy side by "
        "side, showing both answers and the KV memory each used.",
    )
    generate.add_argument("--model", help="local path or hub id of a Qwen3 / Qwen2 / Llama causal LM")
    generate.add_argument("--prompt", help="prompt text (with --model)")
    generate.add_argument("--policy", default="vase", choices=POLICIES, help="eviction policy (default: vase)")
    generate.add_argument(
        "--budget", type=_positive_int,
        help=f"tokens kept per head after an eviction (default {DEFAULT_BUDGET}; 4x compression for the testbed)",
    )
    generate.add_argument(
        "--window", type=_positive_int, help=f"recent/observation window (default {DEFAULT_WINDOW}; 16 for the testbed)"
    )
    generate.add_argument("--n-protect", type=int, help="value-protected tokens (default budget // 4)")
    generate.add_argument("--value-stat", default="range", choices=VALUE_STATS, help="value magnitude statistic")
    generate.add_argument(
        "--evict-temperature", type=_non_negative_float, default=1.0, help="Gumbel sampling temperature of eviction (0 = top-k)"
    )
    generate.add_argument(
        "--max-new-tokens", type=_positive_int,
        help=f"tokens to generate (default {DEFAULT_MAX_NEW_TOKENS}; a whole trace for the testbed)",
    )
    generate.add_argument(
        "--temperature", type=_non_negative_float, default=0.0, help="decoding temperature (0 = greedy, the default)"
    )
    generate.add_argument(
        "--seed", type=int, default=0, help="seed of decoding and eviction sampling (and the testbed problem shown)"
    )
    generate.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (default)")
    generate.add_argument("--dtype", default="auto", choices=["auto", *DTYPES], help="model dtype (auto: bf16 on GPU, fp32 on CPU)")
    generate.add_argument(
        "--compile", default=None, choices=["default", "reduce-overhead", "max-autotune"], help="torch.compile mode for decode steps"
    )
    generate.set_defaults(handler=run_generate)
    _add_eval_parser(commands)
    return parser


def _add_eval_parser(commands) -> None:
    from vase_triton.eval.tasks import HUB_TASKS

    evaluate = commands.add_parser(
        "eval",
        help="measure accuracy under every policy and budget on reasoning benchmarks",
        description="Evaluate policies × budgets × samples on reasoning tasks, one JSONL line per sample "
        "(resumable), then write summary.md, summary.csv and plots into --out. Without --model, the built-in "
        "testbed model is measured on held-out testbed problems at 2x, 4x and 8x compression.",
    )
    evaluate.add_argument("--model", help="local path or hub id of a Qwen3 / Qwen2 / Llama causal LM")
    evaluate.add_argument(
        "--tasks", type=_task_list,
        help=f"comma-separated: {', '.join(HUB_TASKS)}, testbed, or paths to .jsonl files "
        f"(default: all hub tasks with --model, testbed without)",
    )
    evaluate.add_argument(
        "--policies", type=_name_list(POLICIES), default=list(POLICIES),
        help=f"comma-separated policies (default: all of {', '.join(POLICIES)})",
    )
    evaluate.add_argument(
        "--budgets", type=_int_list, help="comma-separated budgets in tokens (default 1024,2048,4096; testbed: 2x,4x,8x)"
    )
    evaluate.add_argument("--window", type=_positive_int, help="recent/observation window (default 64; 16 for the testbed)")
    evaluate.add_argument("--samples", type=_positive_int, help="samples per problem (default 8; 1 for the testbed)")
    evaluate.add_argument("--max-new-tokens", type=_positive_int, help="generation limit (default 32768)")
    evaluate.add_argument(
        "--batch-size", type=_positive_int, help="rows generated together (default 16; 64 for the testbed)"
    )
    evaluate.add_argument("--limit", type=_positive_int, help="only the first N problems of each task")
    evaluate.add_argument(
        "--problems", type=_positive_int, default=64, help="testbed problems to generate (default 64)"
    )
    evaluate.add_argument("--out", help="output directory (default: vase-eval-testbed without --model)")
    evaluate.add_argument("--seed", type=int, default=0, help="run seed: decoding and eviction seeds derive from it")
    evaluate.add_argument("--temperature", type=_non_negative_float, help="override the generation config's temperature (0 = greedy)")
    evaluate.add_argument("--top-p", type=_non_negative_float, help="override the generation config's top-p")
    evaluate.add_argument("--top-k", type=int, help="override the generation config's top-k")
    evaluate.add_argument(
        "--grading-timeout", type=_non_negative_float, default=10.0, help="seconds allowed to grade one answer"
    )
    evaluate.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (default)")
    evaluate.add_argument("--dtype", default="auto", choices=["auto", *DTYPES], help="model dtype (auto: bf16 on GPU, fp32 on CPU)")
    evaluate.add_argument("--no-progress", action="store_true", help="no progress bar")
    evaluate.set_defaults(handler=run_eval_command)


def _resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise CommandError(f"--device: expected cpu, cuda, cuda:N or auto; got {name!r}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise CommandError(f"--device: {name} requested but no CUDA device is available")
    return device


def _quiet_transformers() -> None:
    """No weight-loading progress bars: the command's own output stays readable."""
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()


def _load(model_id: str, device: torch.device, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _quiet_transformers()
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_id)
        model = AutoModelForCausalLM.from_pretrained(model_id, dtype=dtype).to(device).eval()
    except Exception as error:  # transformers raises many types for a missing or invalid model
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise CommandError(f"--model: cannot load {model_id!r}: {first_line}") from None
    tokenizer.padding_side = "left"
    from vase_triton.integrations.models import SUPPORTED_MODEL_TYPES

    if getattr(model.config, "model_type", None) not in SUPPORTED_MODEL_TYPES:
        raise CommandError(
            f"--model: unsupported model type {getattr(model.config, 'model_type', None)!r}; "
            f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    return model, tokenizer


def format_bytes(count: float) -> str:
    for unit in ("B", "KiB", "MiB"):
        if count < 1024:
            return f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} GiB"


def _vase_config(**fields) -> VaSEConfig:
    try:
        return VaSEConfig(**fields)
    except (ValueError, TypeError) as error:
        raise CommandError(str(error)) from None


def _resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    return DTYPES.get(name) or (torch.bfloat16 if device.type == "cuda" else torch.float32)


def run_generate(args) -> int:
    device = _resolve_device(args.device)
    dtype = _resolve_dtype(args.dtype, device)
    if args.model is None:
        return _generate_testbed(args, device, dtype)
    from vase_triton.integrations.hf_cache import VaSECache
    from vase_triton.integrations.models import patch_any

    max_new_tokens = args.max_new_tokens or DEFAULT_MAX_NEW_TOKENS
    config = _vase_config(
        policy=args.policy,
        budget=args.budget or DEFAULT_BUDGET,
        window=args.window or DEFAULT_WINDOW,
        n_protect=args.n_protect,
        value_stat=args.value_stat,
        temperature=args.evict_temperature,
        seed=args.seed,
    )
    model, tokenizer = _load(args.model, device, dtype)
    patch_any(model, config, compile_mode=args.compile)
    inputs = tokenizer([args.prompt or DEFAULT_PROMPT], return_tensors="pt")
    input_ids = inputs["input_ids"].to(device)
    attention_mask = inputs["attention_mask"].to(device)
    prompt_len = input_ids.shape[1]
    cache = VaSECache.for_model(model, config, batch_size=1, max_length=prompt_len + max_new_tokens)
    torch.manual_seed(args.seed)
    sampling = {"do_sample": True, "temperature": args.temperature} if args.temperature > 0 else {"do_sample": False}
    pad_id = getattr(tokenizer, "pad_token_id", None)
    if pad_id is None:
        pad_id = getattr(tokenizer, "eos_token_id", None)

    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    with torch.inference_mode():
        output = model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            max_new_tokens=max_new_tokens,
            pad_token_id=pad_id,
            cache=cache,
            **sampling,
        )
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elapsed = time.perf_counter() - start

    new_tokens = output[0, prompt_len:]
    text_config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    head_dim = getattr(text_config, "head_dim", None) or text_config.hidden_size // text_config.num_attention_heads
    kv_heads = getattr(text_config, "num_key_value_heads", None) or text_config.num_attention_heads
    total = prompt_len + new_tokens.numel()
    full_bytes = 2 * text_config.num_hidden_layers * kv_heads * total * head_dim * torch.tensor([], dtype=model.dtype).element_size()
    print(tokenizer.decode(new_tokens.tolist(), skip_special_tokens=True))
    print()
    print(f"model:            {args.model}")
    print(f"policy:           {config.policy} (budget {config.budget}, window {config.window}, capacity {cache.capacity})")
    print(f"prompt tokens:    {prompt_len}")
    print(f"tokens generated: {new_tokens.numel()} in {elapsed:.2f} s ({new_tokens.numel() / max(elapsed, 1e-9):.1f} tokens/s)")
    print(f"evictions:        {cache.n_evictions} per layer")
    print(f"KV memory:        {format_bytes(cache.memory_bytes)} static cache vs {format_bytes(full_bytes)} for a full cache of {total} tokens")
    return 0


def _generate_testbed(args, device: torch.device, dtype: torch.dtype) -> int:
    from vase_triton.testbed.demo import side_by_side
    from vase_triton.testbed.harness import MAX_NEW_TOKENS, TESTBED_WINDOW, compression_budget

    if args.prompt is not None:
        raise CommandError("--prompt: the built-in testbed model answers generated testbed problems; pass --model to use a prompt")
    if args.policy == "full":
        raise CommandError("--policy: the testbed demo compares the full cache with an evicting policy; got 'full'")
    if args.seed < 0:
        raise CommandError(f"--seed: expected >= 0 (it also picks the testbed problem); got {args.seed}")
    config = _vase_config(
        policy=args.policy,
        budget=args.budget or compression_budget(4),
        window=args.window or TESTBED_WINDOW,
        n_protect=args.n_protect,
        value_stat=args.value_stat,
        temperature=args.evict_temperature,
        seed=args.seed,
    )
    if args.compile:
        raise CommandError("--compile: the testbed demo runs eagerly; use it with --model")
    _quiet_transformers()
    try:
        side_by_side(config, problem_index=args.seed, max_new_tokens=args.max_new_tokens or MAX_NEW_TOKENS, device=device, dtype=dtype)
    except FileNotFoundError as error:
        raise CommandError(str(error)) from None
    return 0


def _sampling(model, args) -> dict:
    """Decoding settings: the model's generation config, overridden by the command's flags."""
    generation = model.generation_config
    temperature = args.temperature if args.temperature is not None else generation.temperature
    do_sample = bool(generation.do_sample) if args.temperature is None else args.temperature > 0
    if not do_sample:
        return {"do_sample": False}
    sampling = {"do_sample": True, "temperature": float(temperature if temperature is not None else 1.0)}
    top_p = args.top_p if args.top_p is not None else generation.top_p
    top_k = args.top_k if args.top_k is not None else generation.top_k
    if top_p is not None:
        sampling["top_p"] = float(top_p)
    if top_k is not None:
        sampling["top_k"] = int(top_k)
    return sampling


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
    return _EvalPlan(
        label=args.model, tasks=args.tasks or list(HUB_TASKS), budgets=args.budgets or [1024, 2048, 4096],
        window=window, samples=samples, max_new_tokens=args.max_new_tokens or 32768,
        batch_size=args.batch_size or 16, out_dir=Path(args.out),
        header=f"model: {args.model}, {samples} sample(s) per problem, window {window}",
    )


def run_eval_command(args) -> int:
    from vase_triton.eval.runner import EvalSettings, RunError, read_results, run_eval
    from vase_triton.eval.summary import SUMMARY_MARKDOWN, markdown_table, write_summary
    from vase_triton.eval.tasks import TaskError, load_task, task_label

    device = _resolve_device(args.device)
    dtype = _resolve_dtype(args.dtype, device)
    plan = _testbed_plan(args) if args.model is None else _model_plan(args)
    for policy in args.policies:
        for budget in plan.budgets:
            _vase_config(policy=policy, budget=budget, window=plan.window)
    try:
        problems = {
            task_label(task): load_task(task, limit=args.limit, testbed_problems=args.problems) for task in plan.tasks
        }
    except TaskError as error:
        raise CommandError(str(error)) from None
    if args.model is None:
        from vase_triton.testbed.model import load_testbed

        _quiet_transformers()
        try:
            model, tokenizer = load_testbed(device=device, dtype=dtype)
        except FileNotFoundError as error:
            raise CommandError(str(error)) from None
    else:
        model, tokenizer = _load(args.model, device, dtype)
    settings = EvalSettings(
        model=plan.label, max_new_tokens=plan.max_new_tokens, batch_size=plan.batch_size, window=plan.window,
        seed=args.seed, sampling=_sampling(model, args), grading_timeout_s=args.grading_timeout,
    )
    try:
        results = run_eval(
            model, tokenizer, problems, policies=args.policies, budgets=plan.budgets, samples=plan.samples,
            settings=settings, out_dir=plan.out_dir, progress=not args.no_progress,
        )
    except RunError as error:
        raise CommandError(str(error)) from None
    records = [record for record in read_results(results) if record["task"] in problems]
    cells = write_summary(records, plan.out_dir, plan.header)
    print(markdown_table(cells, "accuracy", "Accuracy (%), mean ± standard error over samples"))
    if any(cell.trace_exact is not None for cell in cells):
        print(markdown_table(cells, "trace_exact", "Whole-trace exact match (%)"))
    print(f"results: {results}; summary: {plan.out_dir / SUMMARY_MARKDOWN} (+ summary.csv, accuracy.png, length.png)")
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.handler(args)
    except CommandError as error:
        print(f"vase-triton: error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("vase-triton: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
