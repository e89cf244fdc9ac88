"""Search spaces: the candidate launch parameters of every tuned kernel, pruned by shape and device.

Each space declares a small grid of block sizes, warps, pipeline stages (and, for decode,
split counts), drops what a shape cannot use (tiles larger than the rows or keys there
are, threads with nothing to do) and what the device cannot hold. Resources are
estimated from the tile sizes: shared memory is the pipelined operand tiles; registers
per thread are a base plus the live fp32 values (and packed 16-bit operands) per thread,
and must stay within 255 and within the registers a block of that many warps may hold.
The formulas were calibrated by compiling every candidate at the Qwen3-8B shapes for
sm_90a with `ptxas` (the method of `benchmarks/compile_audit.py`): the shared-memory
estimates match exactly for the prefill kernels and within 64 bytes per key slot for
decode; register estimates are within about 15% or err on the high side. The tuner
skips any candidate that fails to compile or to launch, so an estimate only saves
compilations.

`KernelSpace.fits` is also what a lookup checks before it uses a stored configuration
for a launch, so a configuration borrowed from a nearby bucket never exceeds the device.
"""

from __future__ import annotations

import abc
import functools
import hashlib
import importlib
import inspect
from typing import Iterator, NamedTuple

import torch
import triton
from triton.runtime.jit import KernelInterface

from vase_triton.autotune.device import DeviceProfile
from vase_triton.autotune.shapes import (
    AppendShape,
    DecodeShape,
    EnergyShape,
    EvictShape,
    PrefillShape,
    ScoresShape,
    SimilarityShape,
)
from vase_triton.kernels.cache_append import AppendConfig, append_heuristic
from vase_triton.kernels.decode_attention import (
    COMBINE_TILE_REGISTERS,
    CombineConfig,
    DecodeConfig,
    combine_heuristic,
    decode_heuristic,
)
from vase_triton.kernels.eviction import (
    CompactConfig,
    SelectConfig,
    TiledSelectConfig,
    candidate_block,
    compact_heuristic,
    select_heuristic,
    tiled_select_heuristic,
)
from vase_triton.kernels.key_similarity import SimilarityConfig, similarity_heuristic
from vase_triton.kernels.prefill_attention import TileConfig, forward_heuristic, scores_heuristic
from vase_triton.kernels.projected_energy import EnergyConfig, energy_heuristic

_ELEMENT_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}
_MAX_REGISTERS_PER_THREAD = 255
_MAX_SPLITS = 128
_MAX_STAGES = 8
_WARPS = (1, 2, 4, 8, 16, 32)


def _pow2(size: int) -> int:
    return triton.next_power_of_2(max(1, size))


def _upto(values: tuple[int, ...], limit: int) -> tuple[int, ...]:
    """`values` not above `limit`, or the smallest one when none is."""
    kept = tuple(value for value in values if value <= limit)
    return kept or (min(values),)


@functools.lru_cache(maxsize=None)
def _module_source_hash(module_name: str) -> str:
    """SHA-256 (16 hex digits) of the source of every Triton function a kernel module defines or imports."""
    module = importlib.import_module(module_name)
    digest = hashlib.sha256()
    for name, value in sorted(vars(module).items()):
        if isinstance(value, KernelInterface):
            digest.update(name.encode())
            digest.update(inspect.getsource(value.fn).encode())
    return digest.hexdigest()[:16]


class Resources(NamedTuple):
    """Estimated shared memory per block (bytes) and registers per thread of one launch."""

    shared_bytes: int
    registers: int


class KernelSpace(abc.ABC):
    """The search space of one kernel: its parameters, grid, resource estimate and heuristic."""

    name: str
    key_fields: tuple[str, ...]  # the fields of its keys, in order
    module: str
    config_type: type
    description: str
    # Smallest value of a parameter the kernel computes correctly with: a tile dimension that
    # is an operand dimension of `tl.dot` needs 16.
    minimums: dict[str, int] = {}

    def key(self, shape: tuple) -> str:
        """The stored key of a launch shape."""
        return shape.key()

    @abc.abstractmethod
    def heuristic(self, shape: tuple, device: torch.device) -> dict:
        """The parameters the launcher picks without tuning."""

    def gpu_heuristic(self, shape: tuple, profile: DeviceProfile) -> dict:
        """The parameters the launcher picks without tuning on a CUDA device of `profile`
        (which need not be present: `--dry-run` lists what a tuning there would try)."""
        return self.fitted(self.heuristic(shape, torch.device("cuda")), shape, profile)

    def fitted(self, params: dict, shape: tuple, profile: DeviceProfile) -> dict:
        """`params`, or where their estimated resources do not fit `profile`'s device (the
        heuristics are written for sm_90's 227 KiB of shared memory a block; sm_86 and sm_89
        have 99 KiB) the first step-down that does: fewer pipeline stages, then narrower key
        tiles, then fewer rows, as far as the kernel's minimums allow."""
        fitted = dict(params)
        while not self.fits(fitted, shape, profile):
            if fitted.get("num_stages", 1) > 1:
                fitted["num_stages"] -= 1
            elif fitted.get("block_n", 0) // 2 >= self.minimums.get("block_n", 16):
                fitted["block_n"] //= 2
            elif fitted.get("block_m", 0) // 2 >= self.minimums.get("block_m", 16):
                fitted["block_m"] //= 2
            else:
                return dict(params)  # nothing smaller to try: the launch reports what does not fit
        return fitted

    @abc.abstractmethod
    def grid(self, shape: tuple, profile: DeviceProfile) -> Iterator[dict]:
        """The declared grid, pruned by what the shape can use."""

    @abc.abstractmethod
    def estimate(self, params: dict, shape: tuple) -> Resources:
        """Estimated resources of one launch with `params` at `shape`."""

    def source_hash(self) -> str:
        """Hash of the kernel sources: entries tuned for another hash are stale."""
        return _module_source_hash(self.module)

    def valid(self, params: object) -> bool:
        """Whether `params` names exactly this kernel's parameters with admissible integer values."""
        if not isinstance(params, dict) or set(params) != set(self.config_type._fields):
            return False
        for name, value in params.items():
            if type(value) is not int or value < 1:
                return False
            if name == "num_warps" and value not in _WARPS:
                return False
            if (name.startswith("block_") or name == "probes") and value & (value - 1):
                return False
            if (name == "num_stages" and value > _MAX_STAGES) or (name == "num_splits" and value > _MAX_SPLITS):
                return False
            if value < self.minimums.get(name, 1):
                return False
        return True

    def fits(self, params: dict, shape: tuple, profile: DeviceProfile) -> bool:
        """Whether the estimated resources of `params` at `shape` fit `profile`'s device."""
        shared, registers = self.estimate(params, shape)
        register_limit = min(_MAX_REGISTERS_PER_THREAD, profile.registers // (32 * params["num_warps"]))
        return shared <= profile.shared_memory and registers <= register_limit

    def candidates(self, shape: tuple, profile: DeviceProfile) -> list[dict]:
        """The pruned search space at `shape` on `profile`'s device, without duplicates, in grid order."""
        seen, kept = set(), []
        for params in self.grid(shape, profile):
            identity = tuple(sorted(params.items()))
            if identity not in seen and self.fits(params, shape, profile):
                seen.add(identity)
                kept.append(params)
        return kept

    def tried(self, default: dict, shape: tuple, profile: DeviceProfile) -> list[dict]:
        """What a tuning tries, in order: the heuristic's `default` first (even outside the
        pruned space, so that its time is known), then the pruned space without it."""
        return [default, *(params for params in self.candidates(shape, profile) if params != default)]


def _threads(params: dict) -> int:
    return 32 * params["num_warps"]


def _probing_registers(params: dict, per_thread: float) -> float:
    """Registers a selection's search with several probes a round adds: its comparisons (reduced as
    they are made, about one more value per slot held) and a count per probe; none when it bisects."""
    return per_thread + 2 * params["probes"] if params["probes"] > 1 else 0


class PrefillForwardSpace(KernelSpace):
    name = "prefill_forward"
    key_fields = ("B", "Tq", "Tk", "H", "D", "dtype", "causal", "values")
    module = "vase_triton.kernels.prefill_attention"
    description = "prefill attention forward: [BLOCK_M, BLOCK_N] query x key tiles"
    minimums = {"block_m": 16, "block_n": 16}
    BLOCK_M = (64, 128)
    BLOCK_N = (32, 64, 128)
    WARPS = (4, 8)
    STAGES = (2, 3, 4)

    config_type = TileConfig

    def heuristic(self, shape: PrefillShape, device: torch.device) -> dict:
        return forward_heuristic(shape)._asdict()

    def grid(self, shape: PrefillShape, profile: DeviceProfile) -> Iterator[dict]:
        return _tile_grid(self, rows=shape.rows(), keys=shape.k_len)

    def estimate(self, params: dict, shape: PrefillShape) -> Resources:
        element, dim = _ELEMENT_BYTES[shape.dtype], shape.head_dim
        block_m, block_n = params["block_m"], params["block_n"]
        operands = 2 if shape.values else 1  # keys (and values) pipelined per stage
        shared = (params["num_stages"] * operands * block_n * dim + block_m * dim) * element
        # A 16-bit tl.dot runs on tensor cores, 16 rows per warp: warps beyond BLOCK_M / 16 do not
        # share the [BLOCK_M, *] tiles (an fp32 one runs on all threads).
        warps = params["num_warps"] if element == 4 else min(params["num_warps"], max(1, block_m // 16))
        threads = 32 * warps
        accumulator = block_m * dim if shape.values else 0
        live = (accumulator + 2 * block_m * block_n) / threads + block_m * dim * element / (4 * threads)
        return Resources(shared, int(30 + live))


def _tile_grid(space: KernelSpace, *, rows: int, keys: int) -> Iterator[dict]:
    """Every `(block_m, block_n, num_warps, num_stages)` of a `[rows] x [keys]` tiled space,
    tiles no larger than the problem (rounded up to a power of two, at least 16)."""
    for block_m in _upto(space.BLOCK_M, max(16, _pow2(rows))):
        for block_n in _upto(space.BLOCK_N, max(16, _pow2(keys))):
            for num_warps in space.WARPS:
                for num_stages in space.STAGES:
                    yield dict(block_m=block_m, block_n=block_n, num_warps=num_warps, num_stages=num_stages)


class PrefillScoresSpace(KernelSpace):
    name = "prefill_scores"
    key_fields = ("B", "W", "Tk", "H", "D", "dtype", "causal")
    module = "vase_triton.kernels.prefill_attention"
    description = "window scores: [BLOCK_M, BLOCK_N] (group x window queries) x key tiles"
    minimums = {"block_m": 16, "block_n": 16}
    BLOCK_M = (32, 64, 128)
    BLOCK_N = (64, 128, 256)
    WARPS = (4, 8)
    STAGES = (2, 3)

    config_type = TileConfig

    def heuristic(self, shape: ScoresShape, device: torch.device) -> dict:
        return scores_heuristic(shape)._asdict()

    def grid(self, shape: ScoresShape, profile: DeviceProfile) -> Iterator[dict]:
        return _tile_grid(self, rows=shape.window * (shape.q_heads // shape.kv_heads), keys=shape.k_len)

    def estimate(self, params: dict, shape: ScoresShape) -> Resources:
        element, dim, threads = _ELEMENT_BYTES[shape.dtype], shape.head_dim, _threads(params)
        block_m, block_n = params["block_m"], params["block_n"]
        shared = (block_n * dim + params["num_stages"] * block_m * dim) * element
        live = 2 * block_m * block_n / threads + block_n * dim * element / (4 * threads)
        return Resources(shared, int(30 + live))


class DecodeSpace(KernelSpace):
    name = "decode"
    key_fields = ("B", "C", "H", "D", "dtype", "scores")
    module = "vase_triton.kernels.decode_attention"
    description = "split-K decode: [BLOCK_N] key blocks, warps, stages and splits per (sequence, KV head)"
    minimums = {"block_n": 16}
    BLOCK_N = (32, 64, 128)
    WARPS = (2, 4, 8)
    STAGES = (2, 3, 4)
    # Split counts giving about this many programs per SM.
    PROGRAMS_PER_SM = (1, 2, 4, 8)

    config_type = DecodeConfig

    def heuristic(self, shape: DecodeShape, device: torch.device) -> dict:
        return decode_heuristic(shape, device)._asdict()

    def gpu_heuristic(self, shape: DecodeShape, profile: DeviceProfile) -> dict:
        return self.fitted(decode_heuristic(shape, torch.device("cuda"), profile.multiprocessors)._asdict(), shape,
                           profile)  # fmt: skip

    def grid(self, shape: DecodeShape, profile: DeviceProfile) -> Iterator[dict]:
        rows = shape.batch * shape.kv_heads
        for block_n in _upto(self.BLOCK_N, max(16, _pow2(shape.capacity))):
            key_blocks = triton.cdiv(shape.capacity, block_n)
            splits = sorted({
                max(1, min(triton.cdiv(per_sm * profile.multiprocessors, rows), key_blocks, _MAX_SPLITS))
                for per_sm in self.PROGRAMS_PER_SM
            })  # fmt: skip
            for num_warps in self.WARPS:
                for num_stages in self.STAGES:
                    for num_splits in splits:
                        yield dict(block_n=block_n, num_warps=num_warps, num_stages=num_stages, num_splits=num_splits)

    def estimate(self, params: dict, shape: DecodeShape) -> Resources:
        element, dim, threads = _ELEMENT_BYTES[shape.dtype], shape.head_dim, _threads(params)
        block_n = params["block_n"]
        group_rows = max(16, _pow2(shape.q_heads // shape.kv_heads))
        # Keys and values of all stages but the one in use, the queries, and per-slot scratch.
        stages = max(1, params["num_stages"] - 1)
        shared = stages * 2 * block_n * dim * element + group_rows * dim * element + 64 * block_n
        logits = (3 if shape.scores else 2) * group_rows * block_n
        live = (group_rows * dim + logits) / threads + 2 * block_n * dim * element / (4 * threads)
        return Resources(shared, int(30 + live))


class DecodeCombineSpace(KernelSpace):
    name = "decode_combine"
    key_fields = ("B", "C", "H", "D", "dtype", "scores")
    module = "vase_triton.kernels.decode_attention"
    description = "decode reduction: warps and [BLOCK_N] score blocks (timed with the split-K stage)"
    BLOCK_N = (64, 128, 256)
    WARPS = (2, 4, 8)

    config_type = CombineConfig

    def heuristic(self, shape: DecodeShape, device: torch.device) -> dict:
        return combine_heuristic(shape)._asdict()

    def grid(self, shape: DecodeShape, profile: DeviceProfile) -> Iterator[dict]:
        # Without scores the combine kernel has no score loop: its block size is unused.
        blocks = self.BLOCK_N if shape.scores else (combine_heuristic(shape).block_n,)
        for block_n in blocks:
            for num_warps in self.WARPS:
                yield dict(block_n=block_n, num_warps=num_warps)

    def estimate(self, params: dict, shape: DecodeShape) -> Resources:
        group_rows = _pow2(shape.q_heads // shape.kv_heads)
        live = (group_rows * shape.head_dim + 2 * group_rows * params["block_n"]) / _threads(params)
        return Resources(0, int(30 + live + COMBINE_TILE_REGISTERS))


class AppendSpace(KernelSpace):
    name = "append"
    key_fields = ("B", "T", "H", "D", "dtype")
    module = "vase_triton.kernels.cache_append"
    description = "cache append: [BLOCK_H, BLOCK_T] (head, token) tiles of all dims"
    BLOCK_H = (1, 2, 4, 8, 16)
    BLOCK_T = (1, 4, 16, 64)
    WARPS = (1, 2, 4, 8)
    MIN_TILE = 1024
    MAX_TILE = 16384

    config_type = AppendConfig

    def heuristic(self, shape: AppendShape, device: torch.device) -> dict:
        return append_heuristic(shape)._asdict()

    def grid(self, shape: AppendShape, profile: DeviceProfile) -> Iterator[dict]:
        block_d = _pow2(shape.head_dim)
        heads, tokens = _upto(self.BLOCK_H, _pow2(shape.kv_heads)), _upto(self.BLOCK_T, _pow2(shape.new_len))
        largest = min(self.MAX_TILE, max(heads) * max(tokens) * block_d)
        for block_h in heads:
            for block_t in tokens:
                tile = block_h * block_t * block_d
                if not min(self.MIN_TILE, largest) <= tile <= self.MAX_TILE:
                    continue
                for num_warps in self.WARPS:
                    if tile >= 32 * num_warps:
                        yield dict(block_h=block_h, block_t=block_t, num_warps=num_warps)

    def estimate(self, params: dict, shape: AppendShape) -> Resources:
        tile = params["block_h"] * params["block_t"] * _pow2(shape.head_dim)
        per_thread = tile / _threads(params)
        return Resources(0, int(30 + per_thread * (2 * _ELEMENT_BYTES[shape.dtype] / 4 + 1)))


class EvictSelectSpace(KernelSpace):
    name = "evict_select"
    key_fields = ("B", "N", "H")
    module = "vase_triton.kernels.eviction"
    description = "eviction selection in registers: BLOCK_R whole rows per program, PROBES thresholds a round"
    BLOCK_R = (1, 2, 4, 8, 16)
    WARPS = (4, 8, 16, 32)
    PROBES = (1, 4, 16)

    config_type = SelectConfig

    def key(self, shape: EvictShape) -> str:
        return shape.select_key()

    def heuristic(self, shape: EvictShape, device: torch.device) -> dict:
        return select_heuristic(shape)._asdict()

    def grid(self, shape: EvictShape, profile: DeviceProfile) -> Iterator[dict]:
        block_n = candidate_block(shape)
        for probes in self.PROBES:
            for block_r in _upto(self.BLOCK_R, _pow2(shape.batch * shape.kv_heads)):
                for num_warps in self.WARPS:
                    if block_r * block_n >= 32 * num_warps:
                        yield dict(block_r=block_r, num_warps=num_warps, probes=probes)

    def estimate(self, params: dict, shape: EvictShape) -> Resources:
        # About six [BLOCK_R, BLOCK_N] keys and masks are live at once.
        per_thread = params["block_r"] * candidate_block(shape) / _threads(params)
        return Resources(0, int(20 + 6 * per_thread + _probing_registers(params, per_thread)))


class EvictSelectTiledSpace(KernelSpace):
    name = "evict_select_tiled"
    key_fields = ("B", "N", "H")
    module = "vase_triton.kernels.eviction"
    description = "eviction selection of long rows: one row per program in [BLOCK_N] tiles, PROBES thresholds a round"
    BLOCK_N = (512, 1024, 2048, 4096)
    WARPS = (4, 8, 16)
    PROBES = (1, 4, 16)

    config_type = TiledSelectConfig

    def key(self, shape: EvictShape) -> str:
        return shape.select_key()

    def heuristic(self, shape: EvictShape, device: torch.device) -> dict:
        return tiled_select_heuristic(shape)._asdict()

    def grid(self, shape: EvictShape, profile: DeviceProfile) -> Iterator[dict]:
        for probes in self.PROBES:
            for block_n in _upto(self.BLOCK_N, _pow2(shape.num_slots)):
                for num_warps in self.WARPS:
                    if block_n >= 32 * num_warps:
                        yield dict(block_n=block_n, num_warps=num_warps, probes=probes)

    def estimate(self, params: dict, shape: EvictShape) -> Resources:
        per_thread = params["block_n"] / _threads(params)
        return Resources(0, int(30 + 7.5 * per_thread + _probing_registers(params, per_thread)))


class EvictCompactSpace(KernelSpace):
    name = "evict_compact"
    key_fields = ("B", "N", "budget", "H", "D", "dtype")
    module = "vase_triton.kernels.eviction"
    description = "eviction compaction: [BLOCK_R, BLOCK_M, BLOCK_D] rows x slots x dims tiles"
    BLOCK_R = (1,)
    BLOCK_M = (32, 64, 128, 256)
    BLOCK_D = (32, 64, 128)
    WARPS = (2, 4, 8)

    config_type = CompactConfig

    def heuristic(self, shape: EvictShape, device: torch.device) -> dict:
        return compact_heuristic(shape)._asdict()

    def grid(self, shape: EvictShape, profile: DeviceProfile) -> Iterator[dict]:
        for block_r in _upto(self.BLOCK_R, _pow2(shape.batch * shape.kv_heads)):
            for block_m in _upto(self.BLOCK_M, _pow2(shape.budget)):
                for block_d in _upto(self.BLOCK_D, _pow2(shape.head_dim)):
                    for num_warps in self.WARPS:
                        if block_r * block_m * block_d >= 32 * num_warps:
                            yield dict(block_r=block_r, block_m=block_m, block_d=block_d, num_warps=num_warps)

    def estimate(self, params: dict, shape: EvictShape) -> Resources:
        # Key and value tiles plus their source and destination offsets.
        tile = params["block_r"] * params["block_m"] * params["block_d"]
        per_thread = tile / _threads(params)
        return Resources(0, int(30 + per_thread * (2 * _ELEMENT_BYTES[shape.dtype] / 4 + 1)))


class ProjectedEnergySpace(KernelSpace):
    name = "projected_energy"
    key_fields = ("B", "N", "H", "D", "R", "dtype")
    module = "vase_triton.kernels.projected_energy"
    description = "vase-dkv importance: BLOCK_N slots per program through the projection in BLOCK_D-wide slices"
    minimums = {"block_n": 16, "block_d": 16}
    BLOCK_N = (16, 64, 128)  # tl.dot needs 16 rows at least
    BLOCK_D = (16, 32, 64)
    WARPS = (2, 4, 8)

    config_type = EnergyConfig

    def heuristic(self, shape: EnergyShape, device: torch.device) -> dict:
        return energy_heuristic(shape)._asdict()

    def grid(self, shape: EnergyShape, profile: DeviceProfile) -> Iterator[dict]:
        # Compiled for sm_90a (registers do not depend on D past the slice): 32-slot tiles take
        # 193 registers or more at 32-wide slices and 16-slot tiles at 2 warps spill at 64-wide
        # ones, so a tile holds 16 slots (4 or 8 warps) or 16 per warp; the estimate drops the
        # 64-wide slices of 64- and 128-slot tiles (225 to 243 registers).
        for block_n in _upto(self.BLOCK_N, max(16, _pow2(shape.num_slots))):
            for block_d in _upto(self.BLOCK_D, max(16, _pow2(shape.head_dim))):
                for num_warps in self.WARPS:
                    if block_n == 16 * num_warps or (block_n == 16 and num_warps >= 4):
                        yield dict(block_n=block_n, block_d=block_d, num_warps=num_warps)

    def estimate(self, params: dict, shape: EnergyShape) -> Resources:
        # Pipelined slices of keys, values (cache dtype) and projection (float32) in shared
        # memory; in registers the two [BLOCK_N, BLOCK_R] products and the key and value slices
        # with their 3xTF32 splits (sm_90 audit: 154 registers at 64 slots, 32-wide slices, 4 warps).
        block_n, block_d, block_r = params["block_n"], params["block_d"], max(16, _pow2(shape.rank))
        stages = 3
        shared = stages * (2 * block_n * block_d * _ELEMENT_BYTES[shape.dtype] + block_d * block_r * 4)
        live = (2 * block_n * block_r + 7 * block_n * block_d) / _threads(params)
        return Resources(shared, int(30 + live))


class KeySimilaritySpace(KernelSpace):
    name = "key_similarity"
    key_fields = ("B", "N", "H", "D", "dtype")
    module = "vase_triton.kernels.key_similarity"
    description = "rkv redundancy: BLOCK_N-slot key tiles, CHUNK slots per unit-key sum program"
    BLOCK_N = (16, 32, 64, 128, 256)
    CHUNK = (512, 1024, 2048)
    WARPS = (2, 4, 8)

    config_type = SimilarityConfig

    def valid(self, params: object) -> bool:
        """As every space, and a chunk of whole `block_n` tiles (tiles crossing chunks would count slots
        twice) no longer than the grid's longest (each program walks its whole chunk, past the row's end too)."""
        return super().valid(params) and params["chunk"] % params["block_n"] == 0 and params["chunk"] <= max(self.CHUNK)

    def heuristic(self, shape: SimilarityShape, device: torch.device) -> dict:
        return similarity_heuristic(shape)._asdict()

    def grid(self, shape: SimilarityShape, profile: DeviceProfile) -> Iterator[dict]:
        for block_n in _upto(self.BLOCK_N, _pow2(shape.num_slots)):
            for chunk in self.CHUNK:
                for num_warps in self.WARPS:
                    if chunk >= block_n and block_n * _pow2(shape.head_dim) >= 32 * num_warps:
                        yield dict(block_n=block_n, chunk=chunk, num_warps=num_warps)

    def estimate(self, params: dict, shape: SimilarityShape) -> Resources:
        # One float32 key tile and its unit keys (sm_90 audit: 86-94 registers at 64 elements per thread).
        per_thread = params["block_n"] * _pow2(shape.head_dim) / _threads(params)
        return Resources(0, int(30 + per_thread))


SPACES: dict[str, KernelSpace] = {
    space.name: space
    for space in (
        PrefillForwardSpace(),
        PrefillScoresSpace(),
        DecodeSpace(),
        DecodeCombineSpace(),
        AppendSpace(),
        EvictSelectSpace(),
        EvictSelectTiledSpace(),
        EvictCompactSpace(),
        ProjectedEnergySpace(),
        KeySimilaritySpace(),
    )
}
