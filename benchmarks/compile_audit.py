"""Compile-only resource audit of the Triton kernels for sm_80 to sm_90 (default H100/H200), no GPU needed.

    python benchmarks/compile_audit.py [--capability {80,86,89,90}]

Each public launcher runs on `meta` tensors at the Qwen3-8B production shapes with its
kernels swapped for recorders, so the audit sees exactly the arguments, constexprs,
`num_warps` and `num_stages` the launcher chooses. The launchers choose as on CUDA device 0
of the target's profile (`TARGETS`: its opt-in shared memory per block and a representative
SM count) with no tuned configuration stored: prefill tiles fitted to its shared memory,
decode splits by its SM count. Every recorded launch is then specialised the way Triton's
JIT does it (pointers and multiples of 16 marked 16-byte divisible, integers equal to 1
folded into constants) and compiled ahead of time for `cuda:<capability>` (sm_90a for 90);
registers and spills are read from the `ptxas -v` log of that compilation.
Eviction at prefill (`N = T` slots) is audited for prompts of 32k and 128k tokens: rows
longer than the in-register limit take the tiled selection kernel, whose tiles (and so
its registers and its compiled variants) do not depend on `N`; the append of such a
prompt spreads its tokens over many programs. The decode-time selection is also audited
with 4 and 16 probes a search round at 8 and 16 warps, autotuning candidates.

Prints a markdown table: shared memory per block (the target's limit: 227 KiB on sm_90,
163 KiB on sm_80, 99 KiB on sm_86 and sm_89), registers per thread, spill stores/loads,
warps and stages, headed by the Triton version and the architecture; `benchmarks/audits/`
keeps it as `compile_sm<capability>_triton-<version>_<date>.md` (`sm90a` for 90). Exits 0
with a message when the NVIDIA backend or `ptxas` is unavailable; exits 1 when a kernel
exceeds shared memory or registers, or spills more than `SPILL_LIMIT_BYTES`.
"""

from __future__ import annotations

import os

# The launchers pick the interpreter's tile sizes while TRITON_INTERPRET is set.
os.environ.pop("TRITON_INTERPRET", None)
# Compile every configuration (no cache hits) and print ptxas's resource log; keep FP fusion on,
# the default of the Triton releases the library runs on.
os.environ["TRITON_ALWAYS_COMPILE"] = "1"
os.environ["TRITON_DUMP_PTXAS_LOG"] = "1"
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")

import argparse  # noqa: E402
import contextlib  # noqa: E402
import dataclasses  # noqa: E402
import io  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Callable, Iterator, Optional  # noqa: E402
from unittest import mock  # noqa: E402

import torch  # noqa: E402
import triton  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vase_triton.autotune import device as autotune_device  # noqa: E402
from vase_triton.autotune import lookup  # noqa: E402
from vase_triton.autotune.device import SHARED_MEMORY_BY_CAPABILITY, SM90_PROFILE, DeviceProfile  # noqa: E402
from vase_triton.cache_tensors import CacheTensors  # noqa: E402
from vase_triton.config import VaSEConfig  # noqa: E402
from vase_triton.kernels import (  # noqa: E402
    cache_append,
    candidate_pool,
    decode_attention,
    eviction,
    gaussian,
    key_similarity,
    prefill_attention,
    projected_energy,
)

REGISTER_LIMIT = 255
SPILL_LIMIT_BYTES = 256


@dataclasses.dataclass(frozen=True)
class Target:
    """A compile target: the architecture ptxas compiles for, the GPUs it stands for and the
    device profile (capability, shared memory per block, SM count) the launchers see there."""

    arch: str
    gpus: str
    profile: DeviceProfile

    @property
    def capability(self) -> int:
        major, minor = self.profile.capability
        return 10 * major + minor


def _profile(gpu: str, multiprocessors: int, capability: tuple[int, int]) -> DeviceProfile:
    """`gpu`'s profile: `multiprocessors` SMs and the opt-in shared memory per block of `capability`."""
    name = f"{gpu} (sm_{capability[0]}{capability[1]} limits)"
    return DeviceProfile(name, multiprocessors, capability, SHARED_MEMORY_BY_CAPABILITY[capability])


# The audited targets by compute capability, each with one representative GPU's SM count.
TARGETS = {
    80: Target("sm_80", "A100", _profile("NVIDIA A100", 108, (8, 0))),
    86: Target("sm_86", "RTX 3090", _profile("NVIDIA GeForce RTX 3090", 82, (8, 6))),
    89: Target("sm_89", "RTX 4090", _profile("NVIDIA GeForce RTX 4090", 128, (8, 9))),
    90: Target("sm_90a", "H100/H200", SM90_PROFILE),  # 132 SMs (H100 SXM, H200), 227 KiB
}

# Qwen3-8B: 32 query heads, 8 KV heads; budget 4096 + window 64 = 4160 cache slots.
PREFILL_TOKENS = 8192
Q_HEADS = 32
KV_HEADS = 8
SCORE_WINDOW = 64
DECODE_BATCH = 16
# Decode attention also at batch 1, where the most splits per row meet in the combine stage.
DECODE_BATCHES = (DECODE_BATCH, 1)
CAPACITY = 4160
BUDGET = 4096
LARGEST_BUDGET = 8192  # the benchmarks' largest: its decode-time selection still holds the candidates in registers
WINDOW = 64
N_SINK = 4
DKV_RANK = VaSEConfig.dkv_rank  # the default width of `vase-dkv`'s projections
LONG_PROMPTS = (32768, 131072)
DTYPES = (torch.bfloat16, torch.float16)
ATTENTION_HEAD_DIMS = (64, 128, 256)
CACHE_HEAD_DIMS = (64, 128)

_TRITON_DTYPES = {
    torch.bfloat16: "bf16",
    torch.float16: "fp16",
    torch.float32: "fp32",
    torch.float64: "fp64",
    torch.int8: "i8",
    torch.int32: "i32",
    torch.int64: "i64",
}


@dataclasses.dataclass(frozen=True)
class Launch:
    """One kernel launch recorded from a launcher."""

    kernel: triton.runtime.JITFunction
    args: tuple
    kwargs: dict


@dataclasses.dataclass(frozen=True)
class Audit:
    """Resources of one compiled kernel."""

    kernel: str
    case: str
    blocks: str
    num_warps: int
    num_stages: int
    shared_bytes: int
    registers: Optional[int]
    spill_stores: Optional[int]
    spill_loads: Optional[int]

    def problems(self, shared_limit: int) -> list[str]:
        """What exceeds the limits, `shared_limit` bytes of shared memory a block among them."""
        found = []
        if self.shared_bytes > shared_limit:
            found.append(f"shared memory over {shared_limit // 1024} KiB")
        if self.registers is not None and self.registers > REGISTER_LIMIT:
            found.append("registers over 255")
        if max(self.spill_stores or 0, self.spill_loads or 0) > SPILL_LIMIT_BYTES:
            found.append(f"spills over {SPILL_LIMIT_BYTES} B")
        return found


class _Recorder:
    """Stands in for a `@triton.jit` kernel: `kernel[grid](...)` records the launch."""

    def __init__(self, kernel: triton.runtime.JITFunction, launches: list[Launch]):
        self._kernel = kernel
        self._launches = launches

    def __getitem__(self, grid) -> Callable[..., None]:
        def launch(*args, **kwargs) -> None:
            self._launches.append(Launch(self._kernel, args, kwargs))

        return launch


@contextlib.contextmanager
def recorded(module, *names: str) -> Iterator[list[Launch]]:
    """Replace kernels `names` of `module` by recorders for the duration of the block."""
    launches: list[Launch] = []
    with contextlib.ExitStack() as stack:
        for name in names:
            stack.enter_context(mock.patch.object(module, name, _Recorder(getattr(module, name), launches)))
        yield launches


@contextlib.contextmanager
def launched_on(profile: DeviceProfile) -> Iterator[None]:
    """The launchers choose as on CUDA device 0 of `profile` with no tuned configuration stored:
    the prefill heuristics' tiles fitted to its shared memory (`lookup.fitted_heuristic`), decode
    splits by its SM count."""
    choose_tiles = prefill_attention._tuned_or_heuristic

    def on_cuda(kernel: str, shape, device: torch.device, heuristic):
        return choose_tiles(kernel, shape, torch.device("cuda", 0), heuristic)

    with (
        mock.patch.object(autotune_device, "cuda_profile", lambda index: profile),
        mock.patch.dict(lookup._fitted, clear=True),
        mock.patch.object(prefill_attention, "tuned_params", lambda kernel, shape, device: None),
        mock.patch.object(prefill_attention, "_tuned_or_heuristic", on_cuda),
        mock.patch.object(decode_attention, "_multiprocessor_count", lambda index: profile.multiprocessors),
    ):
        yield


def _meta(*shape: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device="meta")


def _dtype_name(dtype: torch.dtype) -> str:
    return _TRITON_DTYPES[dtype]


def prefill_launches(dtype: torch.dtype, head_dim: int, ragged: bool) -> list[Launch]:
    """Causal prefill of `[B, 32, 8192, D]` prompts with window scores; `ragged`: B=2 with `kv_lens`."""
    batch = 2 if ragged else 1
    q = _meta(batch, Q_HEADS, PREFILL_TOKENS, head_dim, dtype=dtype)
    k = _meta(batch, KV_HEADS, PREFILL_TOKENS, head_dim, dtype=dtype)
    v = _meta(batch, KV_HEADS, PREFILL_TOKENS, head_dim, dtype=dtype)
    kv_lens = _meta(batch, dtype=torch.int32) if ragged else None
    with recorded(prefill_attention, "_prefill_forward_kernel", "_prefill_scores_kernel") as launches:
        prefill_attention.prefill_attention_triton(q, k, v, kv_lens, head_dim**-0.5, True, SCORE_WINDOW)
    return launches


def _production_splits(batch: int, head_dim: int, dtype: torch.dtype) -> int:
    """The decode launcher's split count on CUDA device 0 (`launched_on`'s SM count)."""
    block_n = decode_attention._decode_config(head_dim, dtype).block_n
    return decode_attention._num_splits(batch, KV_HEADS, CAPACITY, block_n, torch.device("cuda", 0))


def decode_launches(dtype: torch.dtype, head_dim: int, emit_scores: bool, batch: int) -> list[Launch]:
    """One decode step of `batch` sequences over a 4160-slot cache."""
    q = _meta(batch, Q_HEADS, 1, head_dim, dtype=dtype)
    k_cache = _meta(batch, KV_HEADS, CAPACITY, head_dim, dtype=dtype)
    v_cache = _meta(batch, KV_HEADS, CAPACITY, head_dim, dtype=dtype)
    cache_lens = _meta(batch, dtype=torch.int32)
    scores = _meta(batch, KV_HEADS, CAPACITY, dtype=torch.float32) if emit_scores else None
    splits = _production_splits(batch, head_dim, dtype)
    with recorded(decode_attention, "_decode_partial_kernel", "_decode_combine_kernel") as launches:
        decode_attention.decode_attention_triton(
            q, k_cache, v_cache, cache_lens, head_dim**-0.5, scores, num_splits=splits
        )
    return launches


def _meta_cache(batch: int, slots: int, head_dim: int, dtype: torch.dtype) -> CacheTensors:
    rows = (batch, KV_HEADS, slots)
    return CacheTensors(
        keys=_meta(*rows, head_dim, dtype=dtype),
        values=_meta(*rows, head_dim, dtype=dtype),
        scores=_meta(*rows, dtype=torch.float32),
        magnitudes=_meta(*rows, dtype=torch.float32),
        positions=_meta(*rows, dtype=torch.int32),
        lengths=_meta(batch, dtype=torch.int32),
        next_positions=_meta(batch, dtype=torch.int32),
    )


def eviction_launches(
    dtype: torch.dtype, head_dim: int, stochastic: bool, keep_scores: bool, batch: int = DECODE_BATCH,
    slots: int = CAPACITY, budget: int = BUDGET,
) -> list[Launch]:
    """One `vase` eviction of `batch` x 8 rows of `slots` slots down to `budget`."""
    cache = _meta_cache(batch, slots, head_dim, dtype)
    importance = _meta(batch, KV_HEADS, slots, dtype=torch.float32)
    kernels = ("_evict_select_kernel", "_evict_select_tiled_kernel", "_evict_compact_kernel")
    with recorded(eviction, *kernels) as launches:
        eviction.evict_triton(
            cache, importance, budget=budget, window=WINDOW, n_sink=N_SINK, n_protect=budget // 4,
            temperature=1.0 if stochastic else 0.0, seed=2**40 + 7, eviction_index=_meta(1, dtype=torch.int64),
            keep_scores=keep_scores,
            trigger_length=budget + 1, noise=None,
        )
    return launches


def probed_selection_launches(probes: int, num_warps: int) -> list[Launch]:
    """The selection of a decode-time `vase` eviction (bf16, D = 128) launched with one row per
    program and `probes` thresholds a search round: autotuning candidates, not the launcher's
    default (bisection)."""
    candidate = eviction.SelectConfig(1, num_warps, probes)
    with mock.patch.object(eviction, "select_heuristic", lambda shape: candidate):
        launches = eviction_launches(torch.bfloat16, 128, stochastic=True, keep_scores=False)
    return [launch for launch in launches if launch.kernel.__name__ == "_evict_select_kernel"]


def recompute_launches(dtype: torch.dtype, head_dim: int) -> list[Launch]:
    """`score_mode="recompute"` importance: 64 window queries of 32 heads over 4096 of 4160 slots."""
    q = _meta(DECODE_BATCH, Q_HEADS, WINDOW, head_dim, dtype=dtype)
    k = _meta(DECODE_BATCH, KV_HEADS, CAPACITY, head_dim, dtype=dtype)
    lens = _meta(DECODE_BATCH, dtype=torch.int32)
    q_valid = _meta(DECODE_BATCH, WINDOW, dtype=torch.bool)
    with recorded(prefill_attention, "_prefill_forward_kernel", "_prefill_scores_kernel") as launches:
        prefill_attention.candidate_attention_triton(q, k, lens, head_dim**-0.5, q_valid)
    return launches


def append_launches(dtype: torch.dtype, head_dim: int, new_tokens: int, batch: int = DECODE_BATCH) -> list[Launch]:
    """Append `new_tokens` tokens per sequence to a `[batch, 8, C, D]` cache (`range` statistic)."""
    cache = _meta_cache(batch, max(CAPACITY, new_tokens), head_dim, dtype)
    new_keys = _meta(batch, KV_HEADS, new_tokens, head_dim, dtype=dtype)
    new_values = _meta(batch, KV_HEADS, new_tokens, head_dim, dtype=dtype)
    with recorded(cache_append, "_cache_append_kernel") as launches:
        cache_append.cache_append_triton(cache, new_keys, new_values, "range")
    return launches


def dkv_launches(dtype: torch.dtype, head_dim: int) -> list[Launch]:
    """`vase-dkv`'s importance at one eviction: its Gaussian projections (`[16, 8, D, 20]` float32
    draws), then the projected energy of every slot of a `[16, 8, 4160, D]` cache."""
    projection = _meta(DECODE_BATCH, KV_HEADS, head_dim, DKV_RANK, dtype=torch.float32)
    cache = _meta_cache(DECODE_BATCH, CAPACITY, head_dim, dtype)
    with recorded(gaussian, "_gaussian_kernel") as launches:
        gaussian.gaussian_triton(projection, 2**40 + 7, _meta(1, dtype=torch.int64))
    with recorded(projected_energy, "_projected_energy_kernel") as energy_launches:
        projected_energy.projected_energy_triton(cache.keys, cache.values, projection, cache.lengths, WINDOW)
    return launches + energy_launches


def pool_launches() -> list[Launch]:
    """The window policies' importance smoothing at one eviction: a width-5 pool of `[16, 8, 4160]` attention."""
    attention = _meta(DECODE_BATCH, KV_HEADS, CAPACITY, dtype=torch.float32)
    with recorded(candidate_pool, "_candidate_pool_kernel") as launches:
        candidate_pool.pooled_candidates_triton(attention, _meta(DECODE_BATCH, dtype=torch.int32), WINDOW, 5)
    return launches


def rkv_launches(dtype: torch.dtype, head_dim: int) -> list[Launch]:
    """`rkv`'s key redundancy at one eviction: the mean key similarities of a `[16, 8, 4160, D]` cache."""
    cache = _meta_cache(DECODE_BATCH, CAPACITY, head_dim, dtype)
    kernels = ("_unit_key_sum_kernel", "_mean_similarity_kernel")
    with recorded(key_similarity, *kernels) as launches:
        key_similarity.mean_key_similarity_triton(cache.keys, cache.lengths, WINDOW)
    return launches


def specialise(launch: Launch) -> tuple[dict, dict, dict]:
    """(signature, constexprs, attrs) of a launch, specialised as Triton's JIT would."""
    kernel = launch.kernel
    values = dict(zip(kernel.arg_names, launch.args))
    values.update({name: value for name, value in launch.kwargs.items() if name in kernel.arg_names})
    signature, constexprs, attrs = {}, {}, {}
    for index, (name, param) in enumerate(zip(kernel.arg_names, kernel.params)):
        value = values[name]
        divisible = [["tt.divisibility", 16]]
        if param.is_constexpr or (type(value) is int and value == 1):
            signature[name] = "constexpr"
            constexprs[name] = value
        elif isinstance(value, torch.Tensor):
            signature[name] = "*" + _dtype_name(value.dtype)
            attrs[(index,)] = divisible
        elif isinstance(value, bool):
            signature[name] = "u1"
        elif isinstance(value, int):
            signature[name] = "i32" if -(2**31) <= value < 2**31 else "i64"
            if value % 16 == 0:
                attrs[(index,)] = divisible
        elif isinstance(value, float):
            signature[name] = "fp32"
        else:
            raise TypeError(f"{kernel.__name__}.{name}: unexpected argument {value!r}")
    return signature, constexprs, attrs


def nvidia_backend_available(capability: int) -> bool:
    """Whether Triton's NVIDIA backend and the ptxas it uses for `capability` are installed."""
    try:
        from triton.backends.nvidia import compiler as nvidia

        path = nvidia.get_ptxas(capability).path
    except (ImportError, AttributeError, RuntimeError, TypeError):
        return False
    return path is not None and os.access(path, os.X_OK)


def ptxas_usage(log: str) -> tuple[Optional[int], Optional[int], Optional[int]]:
    """(registers, spill store bytes, spill load bytes) from a `ptxas -v` log; None where absent."""
    registers = re.search(r"Used (\d+) registers", log)
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    return (
        int(registers.group(1)) if registers else None,
        int(spills.group(1)) if spills else None,
        int(spills.group(2)) if spills else None,
    )


# Tile-size constexprs and their labels in the `blocks` column.
_BLOCK_LABELS = {
    "BLOCK_M": "M", "BLOCK_N": "N", "BLOCK_G": "G", "BLOCK_S": "S", "BLOCK_R": "R", "BLOCK_D": "D", "BLOCK_H": "H",
    "BLOCK_T": "T", "SPLIT_TILE": "tile",
}  # fmt: skip


def audit(launch: Launch, case: str, capability: int) -> Audit:
    """Compile one recorded launch for `capability` (90: sm_90a) and read its resources."""
    signature, constexprs, attrs = specialise(launch)
    options = {
        "num_warps": launch.kwargs.get("num_warps", 4),
        "num_stages": launch.kwargs.get("num_stages", 3),
    }
    source = triton.compiler.ASTSource(fn=launch.kernel, signature=signature, constexprs=constexprs, attrs=attrs)
    log = io.StringIO()
    with contextlib.redirect_stdout(log):
        compiled = triton.compile(
            source, target=triton.backends.compiler.GPUTarget("cuda", capability, 32), options=options
        )
    registers, spill_stores, spill_loads = ptxas_usage(log.getvalue())
    blocks = " ".join(f"{label}{constexprs[name]}" for name, label in _BLOCK_LABELS.items() if name in constexprs)
    return Audit(
        kernel=launch.kernel.__name__,
        case=case,
        blocks=blocks,
        num_warps=compiled.metadata.num_warps,
        num_stages=compiled.metadata.num_stages,
        shared_bytes=compiled.metadata.shared,
        registers=registers,
        spill_stores=spill_stores,
        spill_loads=spill_loads,
    )


def cases() -> Iterator[tuple[str, list[Launch]]]:
    """(description, launches) of every production configuration audited."""
    yield f"candidate pool B{DECODE_BATCH} Hkv{KV_HEADS} C{CAPACITY} width5 fp32", pool_launches()
    for probes in (4, 16):
        for num_warps in (8, 16):
            yield (
                f"evict select B{DECODE_BATCH} Hkv{KV_HEADS} C{CAPACITY} gumbel probes{probes} (a tuning candidate)",
                probed_selection_launches(probes, num_warps),
            )
    for dtype in DTYPES:
        name = _dtype_name(dtype)
        for head_dim in ATTENTION_HEAD_DIMS:
            for ragged in (False, True):
                yield (
                    f"prefill B{2 if ragged else 1} T{PREFILL_TOKENS} Hq{Q_HEADS} Hkv{KV_HEADS} W{SCORE_WINDOW} "
                    f"D{head_dim} {name}{' kv_lens' if ragged else ''}",
                    prefill_launches(dtype, head_dim, ragged),
                )
        for batch in DECODE_BATCHES:
            for head_dim in ATTENTION_HEAD_DIMS:
                for emit in (True, False):
                    yield (
                        f"decode B{batch} C{CAPACITY} D{head_dim} {name} scores={'on' if emit else 'off'}",
                        decode_launches(dtype, head_dim, emit, batch),
                    )
        for head_dim in CACHE_HEAD_DIMS:
            for stochastic, keep_scores in ((True, False), (False, True)):
                yield (
                    f"evict B{DECODE_BATCH} Hkv{KV_HEADS} C{CAPACITY} D{head_dim} {name} "
                    f"{'gumbel' if stochastic else 'top-k'} keep_scores={keep_scores}",
                    eviction_launches(dtype, head_dim, stochastic, keep_scores),
                )
        large = LARGEST_BUDGET + WINDOW
        yield (
            f"evict B{DECODE_BATCH} Hkv{KV_HEADS} C{large} budget{LARGEST_BUDGET} D128 {name} gumbel keep_scores=False",
            eviction_launches(dtype, 128, True, False, slots=large, budget=LARGEST_BUDGET),
        )
        for head_dim in CACHE_HEAD_DIMS:
            for prompt in LONG_PROMPTS:
                yield (
                    f"evict prompt B1 Hkv{KV_HEADS} N{prompt} D{head_dim} {name} gumbel",
                    eviction_launches(dtype, head_dim, True, False, batch=1, slots=prompt),
                )
        for head_dim in ATTENTION_HEAD_DIMS:
            yield (
                f"vase-dkv importance B{DECODE_BATCH} Hkv{KV_HEADS} C{CAPACITY} D{head_dim} rank{DKV_RANK} {name}",
                dkv_launches(dtype, head_dim),
            )
            yield (
                f"rkv redundancy B{DECODE_BATCH} Hkv{KV_HEADS} C{CAPACITY} D{head_dim} {name}",
                rkv_launches(dtype, head_dim),
            )
        for head_dim in ATTENTION_HEAD_DIMS:
            yield (
                f"recompute scores B{DECODE_BATCH} Hq{Q_HEADS} W{WINDOW} C{CAPACITY} D{head_dim} {name}",
                recompute_launches(dtype, head_dim),
            )
        for head_dim in CACHE_HEAD_DIMS:
            for new_tokens in (1, PREFILL_TOKENS):
                yield f"append B{DECODE_BATCH} Hkv{KV_HEADS} T{new_tokens} D{head_dim} {name}", (
                    append_launches(dtype, head_dim, new_tokens)
                )
            for prompt in LONG_PROMPTS:
                yield f"append prompt B1 Hkv{KV_HEADS} T{prompt} D{head_dim} {name}", (
                    append_launches(dtype, head_dim, prompt, batch=1)
                )


def _optional(value: Optional[int]) -> str:
    return "n/a" if value is None else str(value)


def render(rows: list[Audit], shared_limit: int) -> str:
    lines = [
        "| kernel | case | blocks | warps | stages | shared (B) | regs | spill st/ld (B) | status |",
        "|---|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        status = "; ".join(row.problems(shared_limit)) or "ok"
        lines.append(
            f"| {row.kernel} | {row.case} | {row.blocks} | {row.num_warps} | {row.num_stages} | "
            f"{row.shared_bytes} | {_optional(row.registers)} | "
            f"{_optional(row.spill_stores)}/{_optional(row.spill_loads)} | {status} |"
        )
    return "\n".join(lines)


def parse_target(argv: Optional[list[str]] = None) -> Target:
    """The target of `--capability` in `argv` (default: the command line)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--capability", type=int, choices=sorted(TARGETS), default=90,
        help="compute capability to compile for and whose limits the launchers see (default: 90, H100/H200)",
    )  # fmt: skip
    return TARGETS[parser.parse_args(argv).capability]


def main(argv: Optional[list[str]] = None) -> int:
    target = parse_target(argv)
    if not nvidia_backend_available(target.capability):
        print("compile audit skipped: Triton's NVIDIA backend or its ptxas is not available on this machine")
        return 0
    shared_limit = target.profile.shared_memory
    compiled: dict[str, Audit] = {}
    rows = []
    with launched_on(target.profile):
        for case, launches in cases():
            for launch in launches:
                key = repr((launch.kernel.__name__, specialise(launch), launch.kwargs.get("num_warps"),
                            launch.kwargs.get("num_stages")))  # fmt: skip
                if key not in compiled:
                    compiled[key] = audit(launch, case, target.capability)
                rows.append(dataclasses.replace(compiled[key], case=case))
    print(f"## Triton {triton.__version__} kernels compiled for {target.arch}\n")
    print(render(rows, shared_limit))
    failed = [row for row in rows if row.problems(shared_limit)]
    if failed:
        print(f"\n{len(failed)} kernel configuration(s) exceed the {target.gpus} ({target.arch}) limits")
        return 1
    print(
        f"\nall {len(rows)} launches fit: shared <= {shared_limit} B, registers <= {REGISTER_LIMIT}, "
        f"spills <= {SPILL_LIMIT_BYTES} B"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
