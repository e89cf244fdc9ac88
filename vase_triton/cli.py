"""The `vase-triton` command (also `python -m vase_triton`).

    vase-triton generate [--model PATH_OR_ID] [--prompt TEXT] [--policy vase] [--budget N] ...

Without `--model` it runs the built-in tiny random Qwen3 (no download). Errors
print one line to stderr and exit non-zero.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Optional, Sequence

import torch

from vase_triton.config import POLICIES, VALUE_STATS, VaSEConfig

DEFAULT_PROMPT = "Question: Natalia sold 48 clips in April and half as many in May. How many clips in total?\nAnswer:"
DEMO_BUDGET = 128
DEMO_MAX_NEW_TOKENS = 512
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
        description="Generate a completion with a VaSE-patched model. Without --model, a tiny randomly "
        "initialised Qwen3 is used (no download; its text is noise).",
    )
    generate.add_argument("--model", help="local path or hub id of a Qwen3 / Qwen2 / Llama causal LM")
    generate.add_argument("--prompt", default=DEFAULT_PROMPT, help="prompt text")
    generate.add_argument("--policy", default="vase", choices=POLICIES, help="eviction policy (default: vase)")
    generate.add_argument(
        "--budget", type=_positive_int, help=f"tokens kept per head after an eviction (default 2048; {DEMO_BUDGET} for the built-in model)"
    )
    generate.add_argument("--window", type=_positive_int, default=64, help="recent/observation window (default 64)")
    generate.add_argument("--n-protect", type=int, help="value-protected tokens (default budget // 4)")
    generate.add_argument("--value-stat", default="range", choices=VALUE_STATS, help="value magnitude statistic")
    generate.add_argument(
        "--evict-temperature", type=_non_negative_float, default=1.0, help="Gumbel sampling temperature of eviction (0 = top-k)"
    )
    generate.add_argument(
        "--max-new-tokens", type=_positive_int, help=f"tokens to generate (default 1024; {DEMO_MAX_NEW_TOKENS} for the built-in model)"
    )
    generate.add_argument(
        "--temperature", type=_non_negative_float, default=0.0, help="decoding temperature (0 = greedy, the default)"
    )
    generate.add_argument("--seed", type=int, default=0, help="seed of decoding and eviction sampling")
    generate.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (default)")
    generate.add_argument("--dtype", default="auto", choices=["auto", *DTYPES], help="model dtype (auto: bf16 on GPU, fp32 on CPU)")
    generate.add_argument(
        "--compile", default=None, choices=["default", "reduce-overhead", "max-autotune"], help="torch.compile mode for decode steps"
    )
    generate.set_defaults(handler=run_generate)
    return parser


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


def _load(args, device: torch.device, dtype: torch.dtype):
    if args.model is None:
        from vase_triton.demo_model import ByteTokenizer, tiny_qwen3

        return tiny_qwen3(seed=args.seed, dtype=dtype, device=device), ByteTokenizer(), "built-in tiny random Qwen3 (no download; output is noise)"
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(args.model)
        model = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype).to(device).eval()
    except Exception as error:  # transformers raises many types for a missing or invalid model
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise CommandError(f"--model: cannot load {args.model!r}: {first_line}") from None
    tokenizer.padding_side = "left"
    return model, tokenizer, args.model


def _format_bytes(count: float) -> str:
    for unit in ("B", "KiB", "MiB"):
        if count < 1024:
            return f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} GiB"


def run_generate(args) -> int:
    from vase_triton.integrations.hf_cache import VaSECache
    from vase_triton.integrations.models import SUPPORTED_MODEL_TYPES, patch_any

    device = _resolve_device(args.device)
    dtype = DTYPES.get(args.dtype) or (torch.bfloat16 if device.type == "cuda" else torch.float32)
    demo = args.model is None
    budget = args.budget or (DEMO_BUDGET if demo else 2048)
    max_new_tokens = args.max_new_tokens or (DEMO_MAX_NEW_TOKENS if demo else 1024)
    try:
        config = VaSEConfig(
            policy=args.policy,
            budget=budget,
            window=args.window,
            n_protect=args.n_protect,
            value_stat=args.value_stat,
            temperature=args.evict_temperature,
            seed=args.seed,
        )
    except (ValueError, TypeError) as error:
        raise CommandError(str(error)) from None

    model, tokenizer, label = _load(args, device, dtype)
    if getattr(model.config, "model_type", None) not in SUPPORTED_MODEL_TYPES:
        raise CommandError(
            f"--model: unsupported model type {getattr(model.config, 'model_type', None)!r}; "
            f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    patch_any(model, config, compile_mode=args.compile)
    inputs = tokenizer([args.prompt], return_tensors="pt")
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
            min_new_tokens=max_new_tokens if demo else None,
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
    print(f"model:            {label}")
    print(f"policy:           {config.policy} (budget {config.budget}, window {config.window}, capacity {cache.capacity})")
    print(f"prompt tokens:    {prompt_len}")
    print(f"tokens generated: {new_tokens.numel()} in {elapsed:.2f} s ({new_tokens.numel() / max(elapsed, 1e-9):.1f} tokens/s)")
    print(f"evictions:        {cache.n_evictions} per layer")
    print(f"KV memory:        {_format_bytes(cache.memory_bytes)} static cache vs {_format_bytes(full_bytes)} for a full cache of {total} tokens")
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
