"""Train the testbed model from scratch: `python -m vase_triton.testbed.train --seed 0 --out DIR`.

Two phases on freshly generated problems (`vase_triton.testbed.task`), loss on the trace only:

1. `--plain-steps` of plain causal training, until the model solves the task exactly;
2. `--noise-steps` with eviction noise: in half of the rows every key but the first
   `NOISE_SINKS` gets a random lifetime (at least `NOISE_WINDOW` queries, then an
   exponential tail whose mean is drawn per row), after which no later query sees it.
   The noise knows nothing of the task: it drops facts and filler alike, so the model
   learns not to lean on tokens it does not need. A count whose fact the noise has
   dropped is left out of the loss: nothing visible determines it, and training the
   model to guess it would teach it to infer facts from its own trace.

Everything is seeded from `--seed` and runs on one CPU thread by default, so a run
reproduces its weights. Writes a transformers model directory (safetensors weights,
tokenizer, generation config) and `training.json` (arguments, time, last metrics).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path

import torch

from vase_triton.testbed.model import testbed_config
from vase_triton.commands.common import finite_float, non_negative_int, positive_int
from vase_triton.testbed.task import DEFAULT_STEPS, END_THINK, HELDOUT_STREAM_SEED, MAX_STEPS, THINK, make_problem
from vase_triton.testbed.tokenizer import build_tokenizer

NOISE_SINKS = 4
NOISE_WINDOW = 16
NOISE_MEAN_LIFETIME = (8.0, 512.0)


def encode_batch(tokenizer, problems) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`input_ids [B, T]` of whole problems, `labels [B, T]` (-100 outside the trace) and
    `fact_positions [B, T]`: for each count label, the position of the prompt fact its step
    reads (-1 for every other position)."""
    think = tokenizer.convert_tokens_to_ids(THINK)
    rows, fact_rows = [], []
    for problem in problems:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": problem.question}], add_generation_prompt=True, tokenize=False
        )
        prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
        trace = tokenizer(" ".join(problem.trace), add_special_tokens=False)["input_ids"]
        rows.append(prompt + trace + [tokenizer.eos_token_id])
        fact_at = {word.split("=")[0]: prompt.index(tokenizer.convert_tokens_to_ids(word)) for word in problem.prompt if "=" in word}
        reads = [-1] * len(rows[-1])
        steps = problem.trace[: problem.trace.index(END_THINK)]
        for index in range(1, len(steps), 2):  # the count words; the word before each names its fact
            reads[len(prompt) + index] = fact_at[steps[index - 1].split(":")[1]]
        fact_rows.append(reads)
    width = len(rows[0])
    if any(len(row) != width for row in rows):
        raise ValueError("problems: expected equal lengths in a batch (same number of steps)")
    input_ids = torch.tensor(rows)
    labels = input_ids.clone()
    first_trace = rows[0].index(think) + 1
    labels[:, :first_trace] = -100
    return input_ids, labels, torch.tensor(fact_rows)


def mask_unseeable_labels(labels: torch.Tensor, fact_positions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`labels [B, T]` with -100 wherever the step's fact is hidden from the query that predicts it.

    `fact_positions [B, T]` comes from `encode_batch`; `mask [B, 1, T, T]` from `eviction_noise_mask`."""
    batch, length = labels.shape
    query = torch.arange(length).clamp(min=1) - 1  # the position whose logits predict each label
    rows = torch.arange(batch).view(batch, 1)
    visible = mask[rows, 0, query.view(1, length), fact_positions.clamp(min=0)]  # [B, T]
    return labels.masked_fill((fact_positions >= 0) & ~visible, -100)


def eviction_noise_mask(batch: int, length: int, noisy_fraction: float, generator: torch.Generator) -> torch.Tensor:
    """`[B, 1, T, T]` bool: query i sees key j when `j <= i` and key j is still alive at i."""
    position = torch.arange(length)
    causal = position.view(1, length, 1) >= position.view(1, 1, length)  # [1, T, T]
    low, high = (math.log(v) for v in NOISE_MEAN_LIFETIME)
    mean = torch.exp(low + (high - low) * torch.rand(batch, 1, generator=generator))  # [B, 1]
    tail = -torch.log1p(-torch.rand(batch, length, generator=generator)) * mean  # [B, T] exponential
    death = position.view(1, length) + NOISE_WINDOW + tail.floor()
    immortal = (position < NOISE_SINKS).view(1, length) | (torch.rand(batch, 1, generator=generator) >= noisy_fraction)
    death = torch.where(immortal, torch.full_like(death, float("inf")), death)
    alive = position.view(1, length, 1) < death.view(batch, 1, length)  # [B, T, T]
    return (causal & alive).unsqueeze(1)


def learning_rate(step: int, total: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress)))


def train(args) -> dict:
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    data_rng = random.Random(args.seed)
    noise_generator = torch.Generator().manual_seed(args.seed + 1)
    tokenizer = build_tokenizer()
    from transformers import Qwen3ForCausalLM

    config = testbed_config(
        hidden_size=args.hidden_size, num_layers=args.layers, num_heads=args.heads, num_kv_heads=args.kv_heads
    )
    config._attn_implementation = "sdpa"
    model = Qwen3ForCausalLM(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.98), weight_decay=0.01)
    total = args.plain_steps + args.noise_steps
    start, metrics = time.perf_counter(), {}
    model.train()
    for step in range(total):
        noisy = step >= args.plain_steps
        if step == args.plain_steps and args.plain_out:
            save(model, tokenizer, Path(args.plain_out), {"arguments": vars(args), "last": metrics})
        problems = [make_problem(data_rng, args.steps) for _ in range(args.batch_size)]
        input_ids, labels, fact_positions = encode_batch(tokenizer, problems)
        mask = eviction_noise_mask(
            input_ids.shape[0], input_ids.shape[1], 0.5 if noisy else 0.0, noise_generator
        )
        labels = mask_unseeable_labels(labels, fact_positions, mask)
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, total, args.lr, args.warmup)
        logits = model(input_ids=input_ids, attention_mask=mask).logits
        targets = labels[:, 1:]
        loss = torch.nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100
        )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step % args.log_every == 0 or step == total - 1:
            with torch.no_grad():
                scored = targets != -100
                right = (logits[:, :-1].argmax(-1) == targets) | ~scored
                metrics = {
                    "step": step,
                    "phase": "noise" if noisy else "plain",
                    "loss": round(loss.item(), 5),
                    "token_accuracy": round(right[scored].float().mean().item(), 5),
                    "exact_rows": round(right.all(dim=1).float().mean().item(), 4),
                    "minutes": round((time.perf_counter() - start) / 60, 2),
                }
            print(json.dumps(metrics), flush=True)
    record = {"arguments": vars(args), "minutes": round((time.perf_counter() - start) / 60, 1), "last": metrics}
    if args.plain_out and args.noise_steps == 0:  # the plain phase ran to the end
        save(model, tokenizer, Path(args.plain_out), record)
    save(model, tokenizer, Path(args.out), record)
    return record


def save(model, tokenizer, out: Path, record: dict) -> None:
    """Write `model` (greedy generation config), `tokenizer` and `training.json` as a model directory."""
    from transformers import GenerationConfig

    out.mkdir(parents=True, exist_ok=True)
    model.generation_config = GenerationConfig(
        do_sample=False, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    (out / "training.json").write_text(json.dumps(record, indent=1) + "\n")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m vase_triton.testbed.train", description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=non_negative_int, default=0,
                        help="seed of the data, the initialisation and the noise")  # fmt: skip
    parser.add_argument("--out", required=True, help="output model directory")
    parser.add_argument("--plain-steps", type=non_negative_int, default=3000,
                        help="optimiser steps without eviction noise")  # fmt: skip
    parser.add_argument("--noise-steps", type=non_negative_int, default=600, help="optimiser steps with eviction noise")
    parser.add_argument("--plain-out", help="also save the model reached at the end of the plain phase here")
    parser.add_argument("--batch-size", type=positive_int, default=16)
    parser.add_argument("--lr", type=finite_float(low=1e-12), default=2e-3, help="peak learning rate")
    parser.add_argument("--warmup", type=non_negative_int, default=100)
    parser.add_argument("--steps", type=positive_int, default=DEFAULT_STEPS,
                        help=f"reasoning steps per problem (at most {MAX_STEPS})")  # fmt: skip
    parser.add_argument("--hidden-size", type=positive_int, default=128)
    parser.add_argument("--layers", type=positive_int, default=4)
    parser.add_argument("--heads", type=positive_int, default=4)
    parser.add_argument("--kv-heads", type=positive_int, default=2)
    parser.add_argument("--threads", type=positive_int, default=1,
                        help="torch CPU threads (1 reproduces weights exactly)")  # fmt: skip
    parser.add_argument("--log-every", type=positive_int, default=50)
    return parser


def check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse (exit status 2, one line) what the arguments' types cannot: their combinations."""
    if args.seed == HELDOUT_STREAM_SEED:
        parser.error(f"--seed: {args.seed} draws the held-out evaluation problems; choose another seed")
    if args.steps > MAX_STEPS:
        parser.error(f"--steps: expected at most {MAX_STEPS}; got {args.steps}")
    if args.plain_steps + args.noise_steps == 0:
        parser.error("--plain-steps, --noise-steps: expected at least one optimiser step in all; got 0")
    if args.hidden_size % args.heads:
        parser.error(f"--hidden-size: expected a multiple of --heads = {args.heads}; got {args.hidden_size}")
    if (args.hidden_size // args.heads) % 2:
        parser.error(f"--hidden-size: expected an even head dim (rotary embeddings rotate pairs) with --heads = "
                     f"{args.heads}; got {args.hidden_size}, head dim {args.hidden_size // args.heads}")
    for name in ("out", "plain_out"):
        path = getattr(args, name)
        if path is not None and Path(path).exists() and not Path(path).is_dir():
            parser.error(f"--{name.replace('_', '-')}: expected a directory; {path} is a file")
    if args.plain_out is not None and Path(args.plain_out).resolve() == Path(args.out).resolve():
        parser.error(f"--plain-out: expected a directory other than --out; got {args.plain_out}")
    if args.heads % args.kv_heads:
        parser.error(f"--kv-heads: expected a divisor of --heads = {args.heads}; got {args.kv_heads}")


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    check_arguments(parser, args)
    train(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
