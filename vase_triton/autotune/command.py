"""`vase-triton autotune`: tune a model's kernel launches on this GPU and store the results.

    vase-triton autotune --model PATH_OR_ID | --config config.json [--batch 1,8,32] [--budget 2048,4096]
        [--prompt-len 1024,8192] [--dtype bfloat16] [--window 64] [--score-mode recompute]
        [--policy vase] [--dkv-rank 20] [--prefill-chunk-size 4096] [--kernels decode,...]
        [--time-limit SECONDS] [--retune]
    vase-triton autotune --model ... --dry-run      # the pruned search spaces, no GPU needed
    vase-triton autotune --show | --clear           # this GPU's stored results

Keys that already have an entry are not tuned again (unless `--retune`); a key whose
tuning was interrupted resumes from its recorded candidates.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import triton

from vase_triton.autotune import settings, store
from vase_triton.autotune.device import SM90_PROFILE, DeviceProfile, current_cuda_profile
from vase_triton.commands.common import (
    CommandError, choice, comma_list, hub_options, is_out_of_memory, locate_model, positive_int,
)

if TYPE_CHECKING:
    from vase_triton.config import VaSEConfig

DTYPE_CHOICES = ("bfloat16", "float16", "float32")
SCORE_MODE_CHOICES = ("recompute", "emitted")


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0; got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0; got {value}")
    return value


def add_autotune_command(subparsers) -> None:
    """Register `autotune` on the `vase-triton` command's subparsers."""
    from vase_triton.autotune.spaces import SPACES
    from vase_triton.config import VaSEConfig
    from vase_triton.policies import POLICIES

    kernels = tuple(SPACES)
    evicting = [name for name, policy in POLICIES.items() if policy.evicts]
    parser = subparsers.add_parser(
        "autotune",
        help="tune the kernels' launch parameters for a model's shapes on this GPU",
        description="Time every candidate launch configuration of the kernels a model uses, check each "
        "against the reference, and store the fastest correct one for this GPU (see README, Autotuning).",
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--model", help="local model directory or hub id (only its config is read, no weights)")
    source.add_argument("--config", help="a model's config.json")
    parser.add_argument("--batch", type=comma_list(positive_int, "positive ints"), default=[1, 8, 32],
                        help="batch sizes (default 1,8,32)")  # fmt: skip
    parser.add_argument("--budget", type=comma_list(positive_int, "positive ints"), default=[2048, 4096],
                        help="cache budgets (default 2048,4096)")  # fmt: skip
    parser.add_argument("--prompt-len", type=comma_list(positive_int, "positive ints"), default=[1024, 8192],
                        help="prompt lengths (default 1024,8192)")  # fmt: skip
    parser.add_argument("--dtype", type=comma_list(choice(DTYPE_CHOICES), ", ".join(DTYPE_CHOICES)),
                        default=["bfloat16"], help="dtypes (default bfloat16)")  # fmt: skip
    parser.add_argument("--window", type=positive_int, default=64, help="recent/observation window (default 64)")
    parser.add_argument("--score-mode", choices=SCORE_MODE_CHOICES,
                        help="how the eviction's window attention is obtained, for policies that observe it "
                        f"(default {VaSEConfig.score_mode})")  # fmt: skip
    parser.add_argument("--policy", choices=evicting, default="vase",
                        help="the eviction policy whose launches are tuned (default vase)")  # fmt: skip
    parser.add_argument("--dkv-rank", type=positive_int,
                        help=f"vase-dkv's projection width (default {VaSEConfig.dkv_rank})")  # fmt: skip
    parser.add_argument("--prefill-chunk-size", type=positive_int, default=VaSEConfig.prefill_chunk_size,
                        help="the caches' prefill_chunk_size, which cuts prompts into the chunks the prefill "
                        f"launches see (default {VaSEConfig.prefill_chunk_size})")  # fmt: skip
    parser.add_argument("--kernels", type=comma_list(choice(kernels), ", ".join(kernels)), default=list(kernels),
                        help=f"kernels to tune, of {', '.join(kernels)} (default: all)")  # fmt: skip
    parser.add_argument("--time-limit", type=_positive_seconds,
                        help="start no new candidate after this many seconds (a later run resumes)")  # fmt: skip
    parser.add_argument("--retune", action="store_true", help="tune keys that already have an entry again")
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--dry-run", action="store_true", help="list the pruned search spaces (no GPU needed)")
    action.add_argument("--show", action="store_true", help="print what is stored for this GPU")
    action.add_argument("--clear", action="store_true", help="remove this GPU's stored results")
    parser.set_defaults(handler=run_autotune)


def _gpu_profile(action: str) -> DeviceProfile:
    profile = current_cuda_profile()
    if profile is None:
        hint = "; --dry-run lists the search spaces without one" if action == "tune" else ""
        raise CommandError(f"autotune: no CUDA GPU found ({action} needs one){hint}")
    return profile


def _store_directory() -> Path:
    """`VASE_AUTOTUNE_DIR` (or its default); one that cannot be used is a one-line error."""
    try:
        return settings.store_directory()
    except ValueError as error:
        raise CommandError(f"autotune: {error}") from None


def _tuning_device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device())


def run_autotune(args) -> int:
    if args.show:
        return _show(_gpu_profile("--show"))
    if args.clear:
        return _clear(_gpu_profile("--clear"))
    from vase_triton.autotune.model_shapes import read_layout, tuning_launches

    if args.model is None and args.config is None:
        raise CommandError("autotune: expected --model PATH_OR_ID or --config config.json (or --show / --clear)")
    too_small = [budget for budget in args.budget if budget <= args.window]
    if too_small:
        raise CommandError(f"--budget: expected values > --window = {args.window}; got {too_small[0]}")
    if args.prefill_chunk_size < args.window:
        raise CommandError(
            f"--prefill-chunk-size: expected >= --window = {args.window}; got {args.prefill_chunk_size}"
        )
    config = _cache_config(args)
    model, options = args.model, {}
    if model is not None:
        from transformers import AutoConfig

        model, local = locate_model(model)
        if not local:
            options = hub_options(model, lambda hub_id: AutoConfig.from_pretrained(hub_id, local_files_only=True))
    try:
        layout = read_layout(model, args.config, **options)
    except ValueError as error:
        raise CommandError(str(error)) from None
    launches = [
        (kernel, shape)
        for kernel, shape in tuning_launches(
            layout, batches=args.batch, budgets=args.budget, prompt_lens=args.prompt_len, dtypes=args.dtype,
            window=args.window, score_mode=config.score_mode, policy=args.policy, dkv_rank=config.dkv_rank,
            prefill_chunk=args.prefill_chunk_size,
        )
        if kernel in args.kernels
    ]  # fmt: skip
    if args.dry_run:
        return _dry_run(launches, layout)
    return _tune_all(launches, _gpu_profile("tune"), args)


def _cache_config(args) -> VaSEConfig:
    """The `VaSEConfig` of the first `--budget` (the settings every budget shares), once every budget's
    is known valid: options the policy would ignore, and settings no cache can have (too few slots for
    the sinks, a projection wider than allowed), are one-line errors."""
    from vase_triton.commands.common import why_ignored
    from vase_triton.config import VaSEConfig
    from vase_triton.policies import POLICIES

    given = {}
    for option, field in (("--score-mode", "score_mode"), ("--dkv-rank", "dkv_rank")):
        value = getattr(args, field)
        if value is None:
            continue
        why = why_ignored(field, POLICIES[args.policy], None)
        if why is not None:
            raise CommandError(f"{option}: {why}, so {option} would be ignored; drop {option}")
        given[field] = value
    configs = []
    for budget in args.budget:
        try:
            configs.append(VaSEConfig(
                policy=args.policy, budget=budget, window=args.window, prefill_chunk_size=args.prefill_chunk_size,
                **given,
            ))  # fmt: skip
        except (ValueError, TypeError) as error:
            field, _, reason = str(error).partition(":")
            if field in given:  # a setting of its own
                raise CommandError(f"--{field.replace('_', '-')}:{reason}") from None
            raise CommandError(f"--budget: {budget} with --window {args.window}: {error}") from None
    return configs[0]


def _dry_run(launches: list[tuple[str, tuple]], layout) -> int:
    from vase_triton.autotune.spaces import SPACES

    gpu = current_cuda_profile()
    profile = gpu or SM90_PROFILE
    limits = gpu.describe() if gpu is not None else f"no GPU: {SM90_PROFILE.describe()}"
    print(f"search spaces for {layout.source} (Hq={layout.q_heads}, Hkv={layout.kv_heads}, D={layout.head_dim}), "
          f"pruned for {limits}; the heuristic's configuration first, always tried")  # fmt: skip
    total = 0
    with triton.knobs.runtime.scope():
        if gpu is None:  # what tuning on an sm_90 GPU would try: its heuristics, also where TRITON_INTERPRET is set
            triton.knobs.runtime.interpret = False
        for kernel, shape in launches:
            space = SPACES[kernel]
            default = space.gpu_heuristic(shape, profile)
            candidates = space.tried(default, shape, profile)
            total += len(candidates)
            print(f"\n{kernel} {space.key(shape)}: {len(candidates)} candidates ({space.description})")
            for params in candidates:
                print(f"  {store.params_id(params)}{'  (heuristic)' if params is default else ''}")
    print(f"\n{len(launches)} keys, {total} candidates")
    return 0


def _format_table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in [header, *rows]]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


def _entry_cells(entry: store.Entry) -> tuple[str, str, str, str]:
    default = f"{entry.default.ms * 1000:.1f}" if entry.default else "failed"
    speedup = f"{entry.speedup:.2f}x" if entry.speedup else "-"
    return default, f"{entry.winner.ms * 1000:.1f}", speedup, store.params_id(entry.winner.params)


def _tune_all(launches: list[tuple[str, tuple]], profile: DeviceProfile, args) -> int:
    from tqdm import tqdm

    from vase_triton.autotune import timing
    from vase_triton.autotune.spaces import SPACES
    from vase_triton.autotune.tuner import DeviceFailure, tune

    device = _tuning_device()
    store_file = store.StoreFile(_store_directory(), profile)
    try:  # before the first candidate compiles, not when its result is stored
        store_file.path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise CommandError(
            f"autotune: VASE_AUTOTUNE_DIR: expected a directory that can be made; cannot make "
            f"{str(store_file.path.parent)!r} ({error.strerror or error})"
        ) from None
    deadline = time.monotonic() + args.time_limit if args.time_limit else None
    print(f"tuning {len(launches)} keys on {profile.describe()}, Triton {triton.__version__}, torch {torch.__version__}")
    print(f"store: {store_file.path}")
    rows, stopped = [], None
    for kernel, shape in launches:
        space = SPACES[kernel]
        key = space.key(shape)
        stored = store.entries(store_file.read(), kernel, space.source_hash()).get(key)
        if stored is not None and not args.retune:
            rows.append((kernel, key, *_entry_cells(stored), "stored"))
            continue
        with tqdm(total=1, desc=f"{kernel} {key}", leave=False, disable=None, file=sys.stderr) as bar:

            def show_progress(done: int, total: int) -> None:
                bar.total = total
                bar.n = done
                bar.refresh()

            try:
                result = tune(
                    kernel, shape, device, store_file, timer=timing.gpu_median_ms, deadline=deadline,
                    on_result=show_progress,
                )  # fmt: skip
            except OSError as error:
                raise CommandError(f"autotune: cannot write {store_file.path}: {error}") from None
            except DeviceFailure as error:
                raise CommandError(f"autotune: {error}") from None
            except RuntimeError as error:
                if not is_out_of_memory(error):
                    raise
                if torch.cuda.is_initialized():
                    torch.cuda.empty_cache()
                rows.append((kernel, key, "-", "-", "-", "out of memory (its results so far are kept)", "skipped"))
                continue
        if not result.completed:
            stopped = f"stopped at --time-limit {args.time_limit:g} s before {kernel} {key}; run again to resume"
            break
        if result.entry is None:
            rows.append((kernel, key, "-", "-", "-", "every candidate failed", "tuned"))
        else:
            rows.append((kernel, key, *_entry_cells(result.entry), "tuned"))
    print()
    header = ("kernel", "key", "default us", "tuned us", "speed-up", "tuned configuration", "status")
    print(_format_table(header, rows) if rows else "nothing tuned")
    if stopped:
        print(stopped)
    return 0


def _show(profile: DeviceProfile) -> int:
    from vase_triton.autotune.spaces import SPACES

    print(f"stored autotuning results for {profile.describe()}")
    rows = []
    for origin, directory in (("user", _store_directory()), ("packaged", settings.PACKAGED_DIRECTORY)):
        file = store.StoreFile(directory, profile)
        document = file.read()
        print(f"{origin} file: {file.path}{'' if document is not None else ' (none)'}")
        for kernel, section in sorted((document or {"kernels": {}})["kernels"].items()):
            if kernel not in SPACES:
                status = f"{origin}, stale (no such kernel in this version)"
            elif section["source_hash"] != SPACES[kernel].source_hash():
                status = f"{origin}, stale (kernel source changed)"
            else:
                status = origin
            for key, data in sorted(section.get("entries", {}).items()):
                rows.append((kernel, key, *_entry_cells(store.Entry.from_json(data)), status))
            for key, by_params in sorted(section.get("trials", {}).items()):
                failed = sum("ms" not in trial for trial in by_params.values())
                done = f"{len(by_params)} tried, {failed} failed"
                rows.append((kernel, key, "-", "-", "-", f"no entry: {done}", status))
    print()
    header = ("kernel", "key", "default us", "tuned us", "speed-up", "tuned configuration", "origin")
    print(_format_table(header, rows) if rows else "nothing stored")
    return 0


def _clear(profile: DeviceProfile) -> int:
    file = store.StoreFile(_store_directory(), profile)
    try:
        existed = file.clear()
    except OSError as error:
        raise CommandError(f"autotune --clear: cannot remove {file.path}: {error.strerror or error}") from None
    if existed:
        print(f"removed {file.path}")
    else:
        print(f"nothing stored for {profile.name} ({profile.multiprocessors} SMs) in {file.path.parent}")
    packaged = store.StoreFile(settings.PACKAGED_DIRECTORY, profile)
    if packaged.path.exists():
        print(f"packaged results in {packaged.path} still apply (they ship with vase_triton)")
    return 0
