"""Search spaces: every configuration gives the reference's result, and pruning respects the device.

Each kernel's pruned space at a small hostile shape (odd lengths, GQA) is run under the
interpreter, one configuration per distinct set of block sizes (warps and stages do not
change interpreted execution), a seeded sample of `SAMPLE` where there are more. Attention
and importance configurations must stay within float tolerance of the float64 reference; append and
eviction configurations must give bit-identical buffers, and every eviction configuration
must select exactly the heuristic configuration's tokens (same philox draws).
"""

from __future__ import annotations

import random

import pytest
import torch

from vase_triton import reference
from vase_triton.autotune.device import SM90_PROFILE, DeviceProfile
from vase_triton.autotune.shapes import (
    AppendShape,
    DecodeShape,
    EnergyShape,
    EvictShape,
    PrefillShape,
    ScoresShape,
    SimilarityShape,
)
from vase_triton.autotune.spaces import SPACES
from vase_triton.cache_tensors import CacheTensors
from vase_triton.kernels import (
    cache_append,
    decode_attention,
    eviction,
    key_similarity,
    prefill_attention,
    projected_energy,
)

SAMPLE = 4
TOLERANCE = {"float32": 2e-5, "float16": 2e-3, "bfloat16": 1.6e-2}


def sampled_configs(kernel: str, shape: tuple) -> list[dict]:
    """One configuration per distinct block sizes (and splits), at most `SAMPLE`, seeded by the kernel name."""
    space = SPACES[kernel]
    distinct = {}
    for params in space.candidates(shape, SM90_PROFILE):
        tiles = tuple(sorted((name, value) for name, value in params.items() if name not in ("num_warps", "num_stages")))
        distinct.setdefault(tiles, params)
    configs = list(distinct.values())
    assert configs, f"{kernel}: empty search space at {shape}"
    if len(configs) > SAMPLE:
        configs = random.Random(kernel).sample(configs, SAMPLE)
    return configs


def ids(configs: list[dict]) -> list[str]:
    return ["-".join(f"{name[:7]}{value}" for name, value in params.items()) for params in configs]


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: str) -> None:
    assert not torch.isnan(actual).any(), "an output was left unwritten (NaN poison)"
    tolerance = TOLERANCE[dtype]
    torch.testing.assert_close(actual.double(), expected.double(), rtol=tolerance, atol=tolerance)


def randn(*shape: int, dtype: str, device, seed: int) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(device, getattr(torch, dtype))


PREFILL_SHAPES = [
    PrefillShape(2, 4, 2, 37, 70, 64, "float16", True, True),
    PrefillShape(2, 4, 1, 9, 45, 32, "float32", False, False),
]
PREFILL_CASES = [(shape, params) for shape in PREFILL_SHAPES for params in sampled_configs("prefill_forward", shape)]


@pytest.mark.parametrize(
    "shape, params", PREFILL_CASES,
    ids=[f"causal{int(s.causal)}-{i}" for (s, _), i in zip(PREFILL_CASES, ids([p for _, p in PREFILL_CASES]))],
)  # fmt: skip
def test_every_prefill_forward_config_matches_the_reference(shape: PrefillShape, params: dict, device):
    q = randn(shape.batch, shape.q_heads, shape.q_len, shape.head_dim, dtype=shape.dtype, device=device, seed=1)
    k = randn(shape.batch, shape.kv_heads, shape.k_len, shape.head_dim, dtype=shape.dtype, device=device, seed=2)
    v = randn(shape.batch, shape.kv_heads, shape.k_len, shape.head_dim, dtype=shape.dtype, device=device, seed=3)
    out = torch.full_like(q, float("nan"))
    lse = torch.full(q.shape[:3], float("nan"), device=device)
    config = prefill_attention.TileConfig(**params)
    prefill_attention.launch_forward(q, k, v, None, out if shape.values else q, lse, 0.125, shape.causal, shape.values, config)
    ref_out, ref_lse, _ = reference.prefill_attention(q.double(), k.double(), v.double(), scale=0.125, causal=shape.causal)
    assert_close(lse, ref_lse, "float32")
    if shape.values:
        assert_close(out, ref_out, shape.dtype)


SCORES_SHAPE = ScoresShape(2, 4, 2, 5, 70, 64, "bfloat16", True)


@pytest.mark.parametrize("params", sampled_configs("prefill_scores", SCORES_SHAPE), ids=ids(sampled_configs("prefill_scores", SCORES_SHAPE)))
def test_every_prefill_scores_config_matches_the_reference(params: dict, device):
    shape = SCORES_SHAPE
    q = randn(shape.batch, shape.q_heads, 11, shape.head_dim, dtype=shape.dtype, device=device, seed=4)
    k = randn(shape.batch, shape.kv_heads, shape.k_len, shape.head_dim, dtype=shape.dtype, device=device, seed=5)
    _, lse, expected = reference.prefill_attention(q.double(), k.double(), k.double(), causal=True, score_window=shape.window)
    scores = torch.full((shape.batch, shape.kv_heads, shape.k_len), float("nan"), device=device)
    prefill_attention.launch_scores(
        q, k, lse.float(), None, scores, 0.125, True, shape.window, prefill_attention.TileConfig(**params)
    )
    assert_close(scores, expected, "float32")


DECODE_SHAPE = DecodeShape(3, 8, 2, 150, 64, "float16", True)


@pytest.mark.parametrize("kernel", ["decode", "decode_combine"])
def test_every_decode_config_matches_the_reference(kernel: str, device):
    shape = DECODE_SHAPE
    q = randn(shape.batch, shape.q_heads, 1, shape.head_dim, dtype=shape.dtype, device=device, seed=6)
    k = randn(shape.batch, shape.kv_heads, shape.capacity, shape.head_dim, dtype=shape.dtype, device=device, seed=7)
    v = randn(shape.batch, shape.kv_heads, shape.capacity, shape.head_dim, dtype=shape.dtype, device=device, seed=8)
    lens = torch.tensor([150, 1, 77], dtype=torch.int32, device=device)
    initial = torch.rand(shape.batch, shape.kv_heads, shape.capacity, generator=torch.Generator().manual_seed(9)).to(device)
    expected_scores = initial.double()
    expected = reference.decode_attention(q.double(), k.double(), v.double(), lens, scale=0.125, scores=expected_scores)
    for params in sampled_configs(kernel, shape):
        if kernel == "decode":
            config, combine = decode_attention.DecodeConfig(**params), decode_attention.combine_heuristic(shape)
        else:
            config, combine = decode_attention.decode_heuristic(shape, device), decode_attention.CombineConfig(**params)
        scores = initial.clone()
        out = decode_attention.decode_attention_triton(
            q, k, v, lens, 0.125, scores, out=torch.full_like(q, float("nan")), config=config, combine_config=combine
        )
        assert_close(out, expected, shape.dtype)
        assert_close(scores, expected_scores, "float32")


APPEND_SHAPES = [AppendShape(2, 2, 5, 64, "bfloat16"), AppendShape(3, 8, 1, 128, "float16")]


@pytest.mark.parametrize("shape", APPEND_SHAPES, ids=[s.key() for s in APPEND_SHAPES])
def test_every_append_config_writes_what_the_reference_writes(shape: AppendShape, device):
    new_keys = randn(shape.batch, shape.kv_heads, shape.new_len, shape.head_dim, dtype=shape.dtype, device=device, seed=10)
    new_values = randn(shape.batch, shape.kv_heads, shape.new_len, shape.head_dim, dtype=shape.dtype, device=device, seed=11)
    initial = CacheTensors.empty(shape.batch, shape.kv_heads, 9, shape.head_dim, dtype=new_keys.dtype, device=device)
    initial.lengths.copy_(torch.tensor([0, 4, 2][: shape.batch], dtype=torch.int32))
    expected = CacheTensors(*(buffer.clone() for buffer in initial))
    reference.append_(expected, new_keys, new_values, value_stat="range")
    for params in sampled_configs("append", shape):
        cache = CacheTensors(*(buffer.clone() for buffer in initial))
        cache_append.cache_append_triton(cache, new_keys, new_values, "range", config=cache_append.AppendConfig(**params))
        for name, actual, wanted in zip(CacheTensors._fields, cache, expected):
            assert torch.equal(actual, wanted), (params, name)


EVICT_SHAPE = EvictShape(2, 3, 40, 24, 6, 64, "float32")
SELECTION = dict(budget=24, window=6, n_sink=2, n_protect=6, seed=31, trigger_length=25, noise=None)


def eviction_state(device) -> tuple[CacheTensors, torch.Tensor]:
    shape = EVICT_SHAPE
    gen = torch.Generator().manual_seed(12)
    rows = (shape.batch, shape.kv_heads, shape.num_slots)
    cache = CacheTensors(
        torch.randn(rows + (shape.head_dim,), generator=gen), torch.randn(rows + (shape.head_dim,), generator=gen),
        torch.rand(rows, generator=gen), (torch.rand(rows, generator=gen) * 16).round() / 4,
        torch.arange(40, dtype=torch.int32).expand(rows).contiguous(), torch.tensor([40, 30], dtype=torch.int32),
        torch.tensor([40, 30], dtype=torch.int32),
    )  # fmt: skip
    importance = torch.rand(rows, generator=gen) * (torch.rand(rows, generator=gen) > 0.2)
    return CacheTensors(*(buffer.to(device) for buffer in cache)), importance.to(device)


def selection(cache, importance, config, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    rows = cache.keys.shape[0] * cache.keys.shape[1]
    sources = torch.full((rows, SELECTION["budget"]), -1, dtype=torch.int32, device=cache.keys.device)
    flags = torch.full((rows,), -1, dtype=torch.int8, device=cache.keys.device)
    counter = torch.zeros(1, dtype=torch.int64, device=cache.keys.device)
    eviction.select_survivors_(
        cache, importance, sources, flags, temperature=temperature, config=config, eviction_index=counter, **SELECTION
    )
    return sources, flags


@pytest.mark.parametrize("kernel", ["evict_select", "evict_select_tiled"])
def test_every_selection_config_selects_exactly_the_same_tokens(kernel: str, device):
    cache, importance = eviction_state(device)
    config_type = eviction.SelectConfig if kernel == "evict_select" else eviction.TiledSelectConfig
    heuristic = config_type(**SPACES[kernel].heuristic(EVICT_SHAPE, device))
    sampled = selection(cache, importance, heuristic, 1.0)
    topk = selection(cache, importance, heuristic, 0.0)
    evicted = topk[1].view(2, 3)[:, 0] == 1
    assert evicted.tolist() == [True, True]
    survivors = reference.select_survivors(
        importance, cache.magnitudes, cache.lengths, budget=24, window=6, n_sink=2, n_protect=6, temperature=0.0,
        uniforms=None,
    )  # fmt: skip
    expected = reference.survivor_slots(survivors, 24)
    assert torch.equal(topk[0].view(2, 3, 24).long(), expected)
    for params in sampled_configs(kernel, EVICT_SHAPE):
        for temperature, wanted in ((1.0, sampled), (0.0, topk)):
            got = selection(cache, importance, config_type(**params), temperature)
            assert all(torch.equal(a, b) for a, b in zip(got, wanted)), (params, temperature)


def test_every_compaction_config_gives_the_reference_eviction(device):
    initial, importance = eviction_state(device)
    expected = CacheTensors(*(buffer.clone() for buffer in initial))
    reference.evict_(expected, importance, temperature=0.0, keep_scores=True, **SELECTION)
    for params in sampled_configs("evict_compact", EVICT_SHAPE):
        cache = CacheTensors(*(buffer.clone() for buffer in initial))
        sources, flags = selection(cache, importance, None, 0.0)
        eviction.compact_survivors_(
            cache, sources, flags, budget=24, window=6, keep_scores=True, config=eviction.CompactConfig(**params)
        )
        for name, actual, wanted in zip(CacheTensors._fields, cache, expected):
            assert torch.equal(actual, wanted), (params, name)


ENERGY_SHAPE = EnergyShape(3, 2, 111, 64, 20, "bfloat16")
# Longer than two of the smallest chunks, so that chunk sizes change the order of the unit-key sums.
SIMILARITY_SHAPE = SimilarityShape(3, 2, 1100, 32, "float16")
IMPORTANCE_WINDOW = 8


def _ragged_lengths(num_slots: int, device) -> torch.Tensor:
    """A full row, a row without candidates and a half-full one."""
    return torch.tensor([num_slots, 1, num_slots // 2], dtype=torch.int32, device=device)


def test_every_projected_energy_config_matches_the_reference(device):
    shape = ENERGY_SHAPE
    rows = (shape.batch, shape.kv_heads, shape.num_slots, shape.head_dim)
    keys = randn(*rows, dtype=shape.dtype, device=device, seed=21)
    values = randn(*rows, dtype=shape.dtype, device=device, seed=22)
    projection = randn(shape.batch, shape.kv_heads, shape.head_dim, shape.rank, dtype="float32", device=device, seed=23)
    lengths = _ragged_lengths(shape.num_slots, device)
    expected = reference.projected_energy(
        keys.double(), values.double(), projection.double(), lengths, window=IMPORTANCE_WINDOW
    )
    for params in sampled_configs("projected_energy", shape):
        energy = projected_energy.projected_energy_triton(
            keys, values, projection, lengths, IMPORTANCE_WINDOW, config=projected_energy.EnergyConfig(**params)
        )
        torch.testing.assert_close(energy.double(), expected, rtol=1e-4, atol=1e-4 * float(expected.abs().max()))


def test_every_key_similarity_config_matches_the_reference(device):
    shape = SIMILARITY_SHAPE
    keys = randn(shape.batch, shape.kv_heads, shape.num_slots, shape.head_dim, dtype=shape.dtype, device=device, seed=24)
    lengths = _ragged_lengths(shape.num_slots, device)
    expected = reference.mean_key_similarity(keys.double(), lengths, window=IMPORTANCE_WINDOW)
    configs = sampled_configs("key_similarity", shape)
    assert len({params["chunk"] for params in configs}) > 1, configs
    for params in configs:
        config = key_similarity.SimilarityConfig(**params)
        similarity = key_similarity.mean_key_similarity_triton(keys, lengths, IMPORTANCE_WINDOW, config=config)
        torch.testing.assert_close(similarity.double(), expected, rtol=0, atol=1e-5)


def test_pruning_drops_what_a_smaller_device_cannot_hold():
    shape = PrefillShape(1, 32, 8, 8192, 8192, 128, "bfloat16", True, True)
    space = SPACES["prefill_forward"]
    small = DeviceProfile("small", 58, (8, 9), 99 * 1024)
    large = space.candidates(shape, SM90_PROFILE)
    kept = space.candidates(shape, small)
    assert 0 < len(kept) < len(large)
    assert all(space.estimate(params, shape).shared_bytes <= 99 * 1024 for params in kept)
    assert any(space.estimate(params, shape).shared_bytes > 99 * 1024 for params in large)


SM89 = DeviceProfile("sm_89", 58, (8, 9), 101376)  # RTX 4090, L4, L40S: 99 KiB of shared memory a block


def test_the_prefill_heuristic_steps_down_to_fit_a_device_with_less_shared_memory(monkeypatch):
    """bf16 at D = 128: 128-row query tiles and 3 stages of 64-key K and V tiles need
    (128 + 3 x 2 x 64) x 128 x 2 = 131,072 bytes; with 2 stages, 98,304 fit sm_89's 101,376."""
    import triton

    from vase_triton.autotune import lookup
    from vase_triton.kernels import prefill_attention

    shape = PrefillShape(1, 32, 8, 4096, 4096, 128, "bfloat16", True, True)
    space = SPACES["prefill_forward"]
    with triton.knobs.runtime.scope():
        triton.knobs.runtime.interpret = False  # a GPU's heuristic
        assert space.gpu_heuristic(shape, SM90_PROFILE) == dict(block_m=128, block_n=64, num_warps=8, num_stages=3)
        assert space.gpu_heuristic(shape, SM89) == dict(block_m=128, block_n=64, num_warps=8, num_stages=2)
        # The launch on such a device takes the same tiles (the lookup's stored entries aside).
        monkeypatch.setattr(lookup, "profile_for", lambda device: SM89)
        monkeypatch.setattr(prefill_attention, "tuned_params", lambda *args: None)
        lookup.reset()
        try:
            launch = prefill_attention._tuned_or_heuristic(
                "prefill_forward", shape, torch.device("cuda", 0), prefill_attention.forward_heuristic
            )
        finally:
            lookup.reset()
    assert launch == prefill_attention.TileConfig(128, 64, 8, 2)


def test_a_heuristic_that_fits_is_kept_and_one_that_cannot_be_made_to_fit_is_left_to_the_launch():
    shape = ScoresShape(1, 32, 8, 64, 4096, 128, "bfloat16", True)
    space = SPACES["prefill_scores"]
    params = dict(block_m=64, block_n=128, num_warps=8, num_stages=3)
    assert space.fitted(params, shape, SM90_PROFILE) == params
    tiny = DeviceProfile("tiny", 1, (8, 0), 1024)  # not even 16 x 16 tiles fit
    assert space.fitted(params, shape, tiny) == params


def test_row_tiles_are_no_larger_than_the_rows_and_non_causal_rows_pack_the_group():
    space = SPACES["prefill_forward"]

    def row_tiles(q_heads: int, q_len: int, causal: bool) -> set[int]:
        shape = PrefillShape(1, q_heads, 8, q_len, 4160, 128, "bfloat16", causal, False)
        return {params["block_m"] for params in space.candidates(shape, SM90_PROFILE)}

    assert row_tiles(32, 64, causal=True) == {64}
    assert row_tiles(8, 64, causal=False) == {64}  # a group of one: 64 rows
    assert row_tiles(32, 16, causal=False) == {64}  # 4 heads x 16 queries
    assert row_tiles(32, 64, causal=False) == {64, 128}  # 4 heads x 64 queries


@pytest.mark.parametrize("kernel", list(SPACES))
def test_heuristic_parameters_are_valid_and_bad_ones_are_not(kernel: str, device):
    shapes = {
        "prefill_forward": PREFILL_SHAPES[0], "prefill_scores": SCORES_SHAPE, "decode": DECODE_SHAPE,
        "decode_combine": DECODE_SHAPE, "append": APPEND_SHAPES[0], "evict_select": EVICT_SHAPE,
        "evict_select_tiled": EVICT_SHAPE, "evict_compact": EVICT_SHAPE, "projected_energy": ENERGY_SHAPE,
        "key_similarity": SIMILARITY_SHAPE,
    }  # fmt: skip
    space = SPACES[kernel]
    params = space.heuristic(shapes[kernel], device)
    assert space.valid(params)
    name = next(iter(params))
    for bad in ({**params, name: 3}, {**params, name: True}, {**params, name: 0}, {**params, "extra": 1}, {}):
        assert not space.valid(bad), bad


@pytest.mark.parametrize(
    "kernel, too_small",
    [("prefill_forward", "block_m"), ("prefill_forward", "block_n"), ("prefill_scores", "block_m"),
     ("prefill_scores", "block_n"), ("decode", "block_n"), ("projected_energy", "block_n"),
     ("projected_energy", "block_d")],
)  # fmt: skip
def test_tile_dimensions_of_a_dot_below_16_are_invalid(kernel: str, too_small: str, device):
    """A hand-edited store must not hand a launch a `tl.dot` operand Triton cannot compile for a GPU."""
    shapes = {"prefill_forward": PREFILL_SHAPES[0], "prefill_scores": SCORES_SHAPE, "decode": DECODE_SHAPE,
              "projected_energy": ENERGY_SHAPE}  # fmt: skip
    space = SPACES[kernel]
    params = space.heuristic(shapes[kernel], device)
    assert space.valid({**params, too_small: 16})
    assert not space.valid({**params, too_small: 8})


def test_key_similarity_chunks_must_hold_whole_tiles(device):
    """Tiles crossing a chunk's end would add the next chunk's first keys twice: such a chunk is invalid."""
    space = SPACES["key_similarity"]
    for chunk in (64, 512):
        assert space.valid(dict(block_n=64, chunk=chunk, num_warps=4))
    for chunk in (16, 96):
        assert not space.valid(dict(block_n=64, chunk=chunk, num_warps=4))


def test_key_similarity_chunks_are_no_longer_than_the_grid_declares():
    """A program walks its whole chunk: a stored chunk of 2**30 slots would run for hours."""
    space = SPACES["key_similarity"]
    assert space.valid(dict(block_n=64, chunk=max(space.CHUNK), num_warps=4))
    for chunk in (2 * max(space.CHUNK), 2**30):
        assert not space.valid(dict(block_n=64, chunk=chunk, num_warps=4))
