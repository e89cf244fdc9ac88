"""`vase-triton generate`: generate with a VaSE-patched model and report speed and KV memory.

    vase-triton generate [--model PATH_OR_ID] [--prompt TEXT | --prompts FILE.jsonl [--out FILE]] ...

One prompt is streamed as it is generated, then summarised; a JSONL file of prompts
(`{"prompt": ..., "id": ...}` per line) runs as left-padded batches and gives one JSON
line per completion. The tokenizer's chat template is applied when it has one (Qwen3:
thinking mode, unless `--no-think`), and sampling follows the model's generation config
unless overridden. Without `--model` the built-in testbed model (no download) solves one
held-out testbed problem with the full cache and with `--policy` side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

from vase_triton.commands.common import (
    CommandError,
    add_config_arguments,
    check_backend,
    config_from_arguments,
    finite_float,
    format_bytes,
    is_out_of_memory,
    load_model,
    non_negative_int,
    positive_int,
    printable,
    quiet_transformers,
    resolve_device,
    resolve_dtype,
    sampling_settings,
)
from vase_triton.config import VaSEConfig
from vase_triton.policies import POLICIES
from vase_triton.testbed.harness import DEMO_PROBLEMS, TESTBED_WINDOW

DEFAULT_PROMPT = "Question: Natalia sold 48 clips in April and half as many in May. How many clips in total?\nAnswer:"
DEFAULT_BUDGET = 2048
DEFAULT_MAX_NEW_TOKENS = 1024
DEFAULT_BATCH_SIZE = 8
COMPILE_CHOICES = ("none", "default", "reduce-overhead", "max-autotune")


def add_generate_command(commands) -> None:
    parser = commands.add_parser(
        "generate",
        help="generate text with a VaSE-patched model and report speed and KV memory",
        description="Generate completions with a VaSE-patched model. Without --model, the built-in testbed model "
        "(no download) solves a held-out testbed problem with the full cache and with --policy side by side, "
        "showing both answers and the KV memory each used.",
    )
    source = parser.add_argument_group("model and prompts")
    source.add_argument("--model", help="local directory or hub id of a Qwen3 / Qwen3-MoE / Qwen2 / Llama causal LM")
    prompts = source.add_mutually_exclusive_group()
    prompts.add_argument("--prompt", help="one prompt, streamed as it is generated (default: a short grade-school "
                         "word problem)")
    prompts.add_argument("--prompts", type=Path, help='JSONL file, one {"prompt": ..., "id": ...} per line, run as batches')
    source.add_argument("--out", type=Path, help="with --prompts: write the JSON line of each completion here (default stdout)")
    source.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    source.add_argument("--batch-size", type=positive_int,
                        help=f"prompts per batch with --prompts (default {DEFAULT_BATCH_SIZE})")
    source.add_argument("--chat", action=argparse.BooleanOptionalAction, default=None,
                        help="apply the tokenizer's chat template (default: when it has one)")
    source.add_argument("--no-think", action="store_true", help="chat template without thinking mode (Qwen3)")
    decoding = parser.add_argument_group("decoding")
    decoding.add_argument("--max-new-tokens", type=positive_int,
                          help=f"tokens to generate (default {DEFAULT_MAX_NEW_TOKENS}; a whole trace for the testbed)")
    decoding.add_argument("--temperature", type=finite_float(),
                          help="decoding temperature (0 = greedy; default: the model's generation config)")
    decoding.add_argument("--top-p", type=finite_float(0.0, 1.0), help="nucleus sampling (default: the model's)")
    decoding.add_argument("--top-k", type=non_negative_int, help="top-k sampling (default: the model's)")
    decoding.add_argument("--seed", type=non_negative_int, default=0,
                          help="seed of decoding and eviction sampling (and the testbed problem shown: number "
                          f"seed mod {DEMO_PROBLEMS})")
    add_config_arguments(parser, default_budget=f"{DEFAULT_BUDGET}; 4x compression for the testbed",
                         default_window=f"{VaSEConfig().window}; {TESTBED_WINDOW} for the testbed")
    runtime = parser.add_argument_group("runtime")
    runtime.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (default)")
    runtime.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                         help="model dtype (auto: bf16 on GPU, fp32 on CPU)")
    runtime.add_argument("--compile", default="none", choices=COMPILE_CHOICES, help="torch.compile mode of decode steps")
    parser.set_defaults(handler=run_generate)


def _read_prompts(path: Path) -> list[tuple[str, str]]:
    """`(id, prompt)` per line of a JSONL file (or pipe); every malformed line is a one-line error naming it."""
    if not path.exists():
        raise CommandError(f"--prompts: no such file: {path}")
    if path.is_dir():
        raise CommandError(f"--prompts: {path} is a directory; expected a JSONL file")
    try:
        content = path.read_bytes()
    except OSError as error:
        raise CommandError(f"--prompts: cannot read {path}: {error.strerror or error}") from None
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError as error:
        raise CommandError(f"--prompts: {path} is not UTF-8 text (byte {error.start})") from None
    records = []
    # Lines end at "\n" alone: str.splitlines() would also split inside a prompt at U+2028 or U+0085.
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise CommandError(f"--prompts: {path} line {number}: not JSON ({error.msg})") from None
        if not isinstance(record, dict) or not isinstance(record.get("prompt"), str):
            raise CommandError(f'--prompts: {path} line {number}: expected an object with a "prompt" string')
        record_id = record.get("id", number)
        if not isinstance(record_id, (str, int)) or isinstance(record_id, bool):
            raise CommandError(f'--prompts: {path} line {number}: expected an "id" string or integer; got '
                               f"{json.dumps(record_id)}")
        records.append((str(record_id), record["prompt"]))
    if not records:
        raise CommandError(f"--prompts: {path} holds no prompts")
    return records


def _check_prompt(prompt: str, where: str, tokenizer) -> None:
    """A prompt must be encodable text with at least one token of its own (before any chat template)."""
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError as error:
        raise CommandError(f"{where}: not valid UTF-8 text (character {error.start})") from None
    if len(tokenizer(prompt, add_special_tokens=False)["input_ids"]) == 0:
        raise CommandError(f"{where}: the prompt is empty (0 tokens)")


def _check_out(out: Path, prompts: Path) -> None:
    """`--out` checked before any work, so that a bad path fails at once: never the prompts file
    (under any name: a hard link, a symbolic link), a directory or a path that cannot be written."""
    if out.is_dir():
        raise CommandError(f"--out: {out} is a directory; expected a file path")
    if out.exists() and prompts.exists() and os.path.samefile(out, prompts):
        raise CommandError(f"--out: {out} is the --prompts file; give another path")
    writable = os.access(out, os.W_OK) if out.exists() else os.access(out.parent, os.W_OK | os.X_OK)
    if not writable:
        raise CommandError(f"--out: cannot write {out}: permission denied or no such directory")


class _LazyFile:
    """A text file opened (and so replaced) at its first write: a run that fails before its first
    batch leaves an earlier `--out` as it was."""

    def __init__(self, path: Path):
        self.path = path
        self._file = None

    def write(self, text: str) -> None:
        if self._file is None:
            try:
                self._file = self.path.open("w", encoding="utf-8")
            except OSError as error:
                raise CommandError(f"--out: cannot write {self.path}: {error.strerror or error}") from None
        self._file.write(text)

    def flush(self) -> None:
        if self._file is not None:
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


def _format_prompt(tokenizer, prompt: str, chat: bool, think: bool) -> str:
    if not chat:
        return prompt
    messages = [{"role": "user", "content": prompt}]
    try:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, enable_thinking=think)
    except Exception as error:  # jinja2's TemplateError, and what a template's own code raises
        raise CommandError(f"--chat: the tokenizer's chat template failed: {error}") from None


class _PrintableStreamer:
    """Streams decoded new text to stdout as it is generated, control characters escaped."""

    def __new__(cls, tokenizer):
        from transformers import TextStreamer

        class Streamer(TextStreamer):
            def on_finalized_text(self, text: str, stream_end: bool = False):
                print(printable(text), flush=True, end="" if not stream_end else None)

        return Streamer(tokenizer, skip_prompt=True, skip_special_tokens=True)


def _full_cache_bytes(model, tokens: int, batch: int) -> int:
    text = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
    element = torch.tensor([], dtype=model.dtype).element_size()
    return 2 * text.num_hidden_layers * kv_heads * head_dim * element * tokens * batch


def _generated_lengths(output: torch.Tensor, prompt_len: int, eos_ids: set) -> list[int]:
    """New tokens per row, up to and including the first end-of-sequence token."""
    lengths = []
    for row in output[:, prompt_len:].tolist():
        ends = [index for index, token in enumerate(row) if token in eos_ids]
        lengths.append(ends[0] + 1 if ends else len(row))
    return lengths


def run_generate(args) -> int:
    device = resolve_device(args.device)
    check_backend(device)
    dtype = resolve_dtype(args.dtype, device)
    if args.model is None:
        return _generate_testbed(args, device, dtype)
    config = config_from_arguments(args, args.budget or DEFAULT_BUDGET)
    if args.out is not None and args.prompts is None:
        raise CommandError("--out: only with --prompts (one JSON line per completion)")
    if args.batch_size is not None and args.prompts is None:
        raise CommandError("--batch-size: only with --prompts (one prompt is one batch)")
    prompt = DEFAULT_PROMPT if args.prompt is None else args.prompt
    records = _read_prompts(args.prompts) if args.prompts is not None else [("1", prompt)]
    batch_size = args.batch_size or DEFAULT_BATCH_SIZE
    sink = None
    if args.prompts is not None:
        if args.out is not None:
            _check_out(args.out, args.prompts)
        sink = sys.stdout if args.out is None else _LazyFile(args.out)
    try:
        return _generate_with_model(args, config, records, batch_size, sink, device, dtype)
    finally:
        if sink is not None and sink is not sys.stdout:
            sink.close()


def _generate_with_model(args, config, records, batch_size: int, sink, device, dtype) -> int:
    """Generate every record in batches of `batch_size`, writing each batch's JSON lines to `sink` (with --prompts)."""
    from vase_triton.integrations.hf_cache import VaSECache
    from vase_triton.integrations.models import patch_any

    max_new_tokens = args.max_new_tokens or DEFAULT_MAX_NEW_TOKENS
    model, tokenizer = load_model(args.model, device, dtype)
    label = args.model
    try:
        patch_any(model, config, compile_mode=None if args.compile == "none" else args.compile)
    except (TypeError, ValueError) as error:
        raise CommandError(f"--model: {str(error).partition(': ')[2] or error}") from None
    has_template = getattr(tokenizer, "chat_template", None) is not None
    if args.chat and not has_template:
        raise CommandError("--chat: this tokenizer has no chat template")
    chat = has_template if args.chat is None else args.chat
    if args.no_think and not chat:
        raise CommandError("--no-think: only with a chat template (this run applies none)")
    sampling = sampling_settings(model, args.temperature, args.top_p, args.top_k)
    pad_id = tokenizer.pad_token_id
    if pad_id is None:
        raise CommandError("--model: the tokenizer has neither a padding nor an end-of-sequence token to pad prompts with")
    eos = model.generation_config.eos_token_id
    eos_ids = set(eos if isinstance(eos, list) else [] if eos is None else [eos])

    for record_id, prompt in records:
        _check_prompt(prompt, "--prompt" if args.prompts is None else f"--prompts: prompt {record_id!r}", tokenizer)
    texts = [_format_prompt(tokenizer, prompt, chat, not args.no_think) for _, prompt in records]

    stream = args.prompts is None and not args.json
    results, total_seconds, evictions, memory, capacity, full_bytes = [], 0.0, 0, 0, 0, 0
    cache = None
    prompt_tokens = generated = 0
    torch.manual_seed(args.seed)
    for start in range(0, len(records), batch_size):
        batch_records, batch_texts = records[start : start + batch_size], texts[start : start + batch_size]
        # A chat template writes its own special tokens (a BOS among them): the tokenizer adds none.
        inputs = tokenizer(batch_texts, return_tensors="pt", padding=True, add_special_tokens=not chat)
        input_ids, attention_mask = inputs["input_ids"].to(device), inputs["attention_mask"].to(device)
        prompt_len = input_ids.shape[1]
        try:
            # The previous batch's cache when it has this size: compiled steps replay its CUDA graphs.
            cache = VaSECache.reuse_or_make(
                cache, model, config, batch_size=len(batch_records), max_length=prompt_len + max_new_tokens
            )
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            began = time.perf_counter()
            with torch.inference_mode():
                output = model.generate(
                    input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=max_new_tokens,
                    pad_token_id=pad_id, cache=cache,
                    streamer=_PrintableStreamer(tokenizer) if stream else None, **sampling,
                )
            if device.type == "cuda":
                torch.cuda.synchronize(device)
        except RuntimeError as error:  # torch.OutOfMemoryError included
            if not is_out_of_memory(error):
                raise
            raise _out_of_memory(
                config, device, f"{len(batch_records)} prompt(s) of up to {prompt_len} + {max_new_tokens} tokens",
                ["--batch-size", "--max-new-tokens"] if args.prompts is not None else ["--max-new-tokens"],
            ) from None
        seconds = time.perf_counter() - began
        total_seconds += seconds
        evictions = max(evictions, cache.n_evictions)
        if cache.memory_bytes > memory:  # the summary's memory and capacity are those of one cache
            memory, capacity = cache.memory_bytes, cache.capacity
        lengths = _generated_lengths(output, prompt_len, eos_ids)
        # What a full cache would hold at the end of this batch: every row at the padded length.
        full_bytes = max(full_bytes, _full_cache_bytes(model, prompt_len + max(lengths), len(batch_records)))
        first = len(results)
        for row, ((record_id, _), length) in enumerate(zip(batch_records, lengths)):
            real_prompt = int(attention_mask[row].sum())
            prompt_tokens += real_prompt
            generated += length
            text = tokenizer.decode(output[row, prompt_len : prompt_len + length].tolist(), skip_special_tokens=True)
            results.append({
                "id": record_id, "prompt_tokens": real_prompt, "tokens_generated": length,
                "evictions": cache.n_evictions, "seconds": round(seconds, 4), "kv_memory_bytes": cache.memory_bytes,
                "text": text,
            })  # fmt: skip
        if sink is not None:
            sink.write("".join(json.dumps(result) + "\n" for result in results[first:]))
            sink.flush()

    summary = {
        "model": label, "policy": config.policy, "budget": config.budget if config.evicts else None,
        "window": config.window if config.evicts else None,
        "capacity": capacity, "prompts": len(records), "prompt_tokens": prompt_tokens,
        "tokens_generated": generated, "seconds": round(total_seconds, 4),
        "tokens_per_second": round(generated / max(total_seconds, 1e-9), 2), "evictions_per_layer": evictions,
        "kv_memory_bytes": memory, "full_cache_bytes": full_bytes, "sampling": sampling,
    }  # fmt: skip
    _print_summary(summary, results, args, stream)
    return 0


def _generate_testbed(args, device: torch.device, dtype: torch.dtype) -> int:
    """The built-in default: one held-out testbed problem, full cache and `--policy` side by side."""
    from vase_triton.testbed.demo import side_by_side
    from vase_triton.testbed.harness import MAX_NEW_TOKENS, TESTBED_WINDOW, compression_budget

    for option, given in (("--prompt", args.prompt is not None), ("--prompts", args.prompts is not None),
                          ("--out", args.out is not None), ("--json", args.json), ("--chat", args.chat is not None),
                          ("--no-think", args.no_think), ("--batch-size", args.batch_size is not None),
                          ("--temperature", args.temperature is not None), ("--top-p", args.top_p is not None),
                          ("--top-k", args.top_k is not None), ("--compile", args.compile != "none")):
        if given:
            raise CommandError(
                f"{option}: only with --model (the built-in testbed model answers its own problems, greedily)"
            )
    if args.policy == "full":
        raise CommandError("--policy: the testbed demo compares the full cache with an evicting policy; got 'full'")
    config = config_from_arguments(args, args.budget or compression_budget(4), TESTBED_WINDOW)
    quiet_transformers()
    try:
        side_by_side(config, problem_index=args.seed % DEMO_PROBLEMS,
                     max_new_tokens=args.max_new_tokens or MAX_NEW_TOKENS, device=device, dtype=dtype)
    except FileNotFoundError as error:
        raise CommandError(str(error)) from None
    except RuntimeError as error:  # torch.OutOfMemoryError included
        if not is_out_of_memory(error):
            raise
        raise _out_of_memory(config, device, "the testbed problem", ["--max-new-tokens"]) from None
    return 0


def _out_of_memory(config: VaSEConfig, device: torch.device, work: str, options: list[str]) -> CommandError:
    """The one-line error of a generation that ran out of memory, naming the options that shrink it."""
    if POLICIES[config.policy].evicts:
        options = [*options, "--budget", *(["--dkv-rank"] if config.policy == "vase-dkv" else [])]
    smaller = options[0] if len(options) == 1 else f"{', '.join(options[:-1])} or {options[-1]}"
    return CommandError(f"generate: out of memory on {device} for {work} with the {config.policy!r} cache; lower {smaller}")


def _print_summary(summary: dict, results: list[dict], args, streamed: bool) -> None:
    if args.json:
        if args.prompts is None:
            summary = {**summary, "text": results[0]["text"]}
        print(json.dumps(summary), file=sys.stderr if args.prompts is not None and args.out is None else sys.stdout)
        return
    stream = sys.stderr if args.prompts is not None and args.out is None else sys.stdout
    if not streamed and args.prompts is None:
        print(printable(results[0]["text"]), file=stream)
    memory, full = summary["kv_memory_bytes"], summary["full_cache_bytes"]
    evicts = POLICIES[summary["policy"]].evicts
    why = " (this run is shorter than the static capacity: eviction pays off past it)" if evicts and memory > full else ""
    shape = (f"budget {summary['budget']}, window {summary['window']}, " if evicts else "no eviction, ")
    lines = [
        "",
        f"model:            {summary['model']}",
        f"policy:           {summary['policy']} ({shape}capacity {summary['capacity']})",
        f"prompts:          {summary['prompts']} ({summary['prompt_tokens']} prompt tokens)",
        f"tokens generated: {summary['tokens_generated']} in {summary['seconds']:.2f} s "
        f"({summary['tokens_per_second']:.1f} tokens/s)",
        f"evictions:        {summary['evictions_per_layer']} per layer",
        f"KV memory:        {format_bytes(memory)} static cache vs {format_bytes(full)} for a full cache{why}",
    ]
    print("\n".join(lines), file=stream)
