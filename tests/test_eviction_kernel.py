"""Fused eviction (`vase_triton.ops.evict_`): invariants, and agreement with the reference.

Every case builds a cache layer with NaN-poisoned unused slots (keys, values, scores,
magnitudes and importance past `lengths[b]`), runs the public op (Triton kernels; CPU
interpreter without CUDA) and checks, per KV-head row:

- rows with `lengths[b] < trigger_length` are bit-identical to before;
- evicted rows hold exactly `budget` tokens with strictly increasing positions, every sink,
  every window token and the `n_protect - n_sink` largest-magnitude non-sink candidates
  survived (sinks count among the protected), survivors' keys/values/magnitudes are
  bit-identical to their sources, freed slots have position -1 and score 0, scores are
  reset in every row (or moved, with `keep_scores`);
- the reference (`vase_triton.reference.evict_`) given the same `noise` selects the same
  tokens and leaves bit-identical buffers. With `temperature > 0` the selection keys pass
  through `log`, whose last bit may differ between implementations: a row may then differ
  only in slots whose reference keys tie: the slots only one side kept, paired in key order
  with those only the other side kept, agree to within 1e-5.

Two cases put NaN, +-inf, -0, negative and denormal importance and non-finite magnitudes
among the live candidates.

The launcher's scratch (survivor slots, flags, the tiled kernel's keys and states) starts
poisoned (NaN, or -7 in integer buffers), so that an entry a kernel forgets to write shows.
"""

from __future__ import annotations

import dataclasses
import zlib
from typing import Optional

import pytest
import torch

from candidate_rows import poison_allocations
from vase_triton import reference
from vase_triton.cache_tensors import CacheTensors
from vase_triton.kernels import eviction as eviction_kernels
from vase_triton.ops import evict_

DTYPE_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}


@dataclasses.dataclass(frozen=True)
class Case:
    batch: int
    kv_heads: int
    slots: int
    head_dim: int
    dtype: torch.dtype
    budget: int
    window: int
    n_sink: int
    n_protect: int
    temperature: float
    lengths: tuple[int, ...]
    trigger_length: Optional[int] = None
    keep_scores: bool = False
    hostile_values: bool = False  # non-finite, negative and denormal importance and magnitudes among the candidates

    @property
    def id(self) -> str:
        lens = "_".join(str(n) for n in self.lengths)
        return (
            f"B{self.batch}-Hkv{self.kv_heads}-N{self.slots}-D{self.head_dim}-{DTYPE_NAMES[self.dtype]}"
            f"-budget{self.budget}-win{self.window}-sink{self.n_sink}-prot{self.n_protect}"
            f"-tau{self.temperature:g}-lens{lens}-trig{self.trigger_length}-keep{int(self.keep_scores)}"
            + ("-hostile" if self.hostile_values else "")
        )

    @property
    def trigger(self) -> int:
        return self.slots if self.trigger_length is None else self.trigger_length


# A covering subset of the hostile matrix: N in {63, 111, 257, 24}, D 64/128/32, every dtype,
# non-power-of-two budgets, Hkv 1..8, ragged batches with full, partial and length-1 rows.
CASES = [
    Case(2, 2, 63, 64, torch.float16, 37, 8, 4, 6, 1.0, (63, 1)),
    Case(3, 4, 111, 128, torch.bfloat16, 71, 16, 2, 10, 0.5, (111, 90, 60), trigger_length=72),
    Case(2, 8, 257, 64, torch.float32, 129, 32, 4, 0, 0.0, (257, 200), trigger_length=130, keep_scores=True),
    Case(1, 1, 24, 128, torch.float16, 9, 4, 0, 5, 2.0, (24,)),
    Case(4, 2, 63, 32, torch.bfloat16, 33, 1, 1, 3, 1.0, (63, 40, 34, 33), trigger_length=34),
    Case(2, 3, 111, 64, torch.float32, 100, 11, 4, 25, 0.0, (111, 101), trigger_length=101),
    # A power-of-two number of candidates (N - window = 64): the selection holds exactly them.
    Case(2, 2, 72, 64, torch.float16, 40, 8, 4, 8, 1.0, (72, 50), trigger_length=41),
    # NaN ranks lowest, +-inf at the ends, -0, negative and denormal importance rank with 0
    # when sampling; NaN magnitudes are never protected, +inf ones always.
    Case(2, 2, 111, 64, torch.float32, 60, 8, 2, 6, 1.0, (111, 90), trigger_length=61, hostile_values=True),
    Case(2, 2, 111, 64, torch.float32, 60, 8, 2, 6, 0.0, (111, 90), trigger_length=61, hostile_values=True),
]

# Written at candidate slots 3, 4, ... of every row, when a case asks for hostile values.
HOSTILE_IMPORTANCE = (float("nan"), float("inf"), float("-inf"), -0.0, -1.0, 1e-40, 0.0, float("inf"), float("nan"))
HOSTILE_MAGNITUDES = (float("nan"), float("inf"), float("-inf"), float("nan"), float("inf"))


def make_state(case: Case, device: torch.device, seed: int) -> dict[str, torch.Tensor]:
    """A cache layer whose unused slots are NaN-poisoned; positions are unique per row."""
    gen = torch.Generator().manual_seed(seed)
    shape = (case.batch, case.kv_heads, case.slots)
    lengths = torch.tensor(case.lengths, dtype=torch.int32)
    valid = torch.arange(case.slots).view(1, 1, -1) < lengths.view(-1, 1, 1)  # [B, 1, N]
    keys = torch.randn(*shape, case.head_dim, generator=gen).to(case.dtype)
    values = torch.randn(*shape, case.head_dim, generator=gen).to(case.dtype)
    keys = keys.masked_fill(~valid.unsqueeze(-1), float("nan"))
    values = values.masked_fill(~valid.unsqueeze(-1), float("nan"))
    scores = torch.rand(shape, generator=gen).masked_fill(~valid, float("nan"))
    # Magnitudes with a few exact ties, so protection's tie-break is exercised.
    magnitudes = (torch.rand(shape, generator=gen) * 16).round() / 4
    magnitudes = magnitudes.masked_fill(~valid, float("nan"))
    importance = torch.rand(shape, generator=gen) * (torch.rand(shape, generator=gen) > 0.1)
    importance = importance.masked_fill(~valid, float("nan"))
    if case.hostile_values:
        importance[..., 3 : 3 + len(HOSTILE_IMPORTANCE)] = torch.tensor(HOSTILE_IMPORTANCE)
        magnitudes[..., 20 : 20 + len(HOSTILE_MAGNITUDES)] = torch.tensor(HOSTILE_MAGNITUDES)
    noise = torch.rand(shape, generator=gen)
    base = torch.randint(0, 1000, (case.batch, case.kv_heads, 1), generator=gen)
    positions = torch.where(valid, base + 3 * torch.arange(case.slots), -1).to(torch.int32)
    state = dict(
        keys=keys, values=values, scores=scores, magnitudes=magnitudes, positions=positions,
        lengths=lengths, next_positions=lengths + 1000, importance=importance, noise=noise,
    )
    return {name: tensor.to(device) for name, tensor in state.items()}


def run(case: Case, state: dict[str, torch.Tensor], op=evict_, **overrides) -> dict[str, torch.Tensor]:
    out = {name: tensor.clone() for name, tensor in state.items()}
    kwargs = dict(
        budget=case.budget, window=case.window, n_sink=case.n_sink, n_protect=case.n_protect,
        temperature=case.temperature, seed=7, keep_scores=case.keep_scores,
        trigger_length=case.trigger_length, noise=out["noise"],
    )
    kwargs.update(overrides)
    op(cache_of(out), out["importance"], **kwargs)
    return out


def cache_of(state: dict[str, torch.Tensor]) -> CacheTensors:
    return CacheTensors(*(state[name] for name in CacheTensors._fields))


def bits(tensor: torch.Tensor) -> torch.Tensor:
    """Bit pattern, so that NaN == NaN and -0 != +0 in comparisons."""
    if tensor.dtype == torch.float32:
        return tensor.view(torch.int32)
    if tensor.dtype in (torch.float16, torch.bfloat16):
        return tensor.view(torch.int16)
    return tensor


def check_invariants(case: Case, before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> None:
    before = {name: tensor.cpu() for name, tensor in before.items()}
    after = {name: tensor.cpu() for name, tensor in after.items()}
    budget = case.budget
    for b, n in enumerate(case.lengths):
        if n < case.trigger:
            assert int(after["lengths"][b]) == n
            for name in ("keys", "values", "magnitudes", "positions"):
                assert torch.equal(bits(after[name][b]), bits(before[name][b])), f"row {b} touched: {name}"
            expected_scores = before["scores"][b] if case.keep_scores else torch.zeros_like(before["scores"][b])
            assert torch.equal(bits(after["scores"][b]), bits(expected_scores)), f"row {b}: scores"
            continue
        assert int(after["lengths"][b]) == budget
        n_candidates = n - case.window
        for h in range(case.kv_heads):
            pos_before = before["positions"][b, h]
            kept_pos = after["positions"][b, h, :budget]
            assert bool((kept_pos[1:] > kept_pos[:-1]).all()), "survivors out of temporal order"
            assert bool((after["positions"][b, h, budget:] == -1).all())
            # Source slot of each survivor (positions are unique within a row).
            src = (pos_before[:n].unsqueeze(0) == kept_pos.unsqueeze(1)).long().argmax(dim=1)
            assert torch.equal(pos_before[src], kept_pos), "survivor with an unknown position"
            kept = set(src.tolist())
            assert set(range(case.n_sink)) <= kept, "a sink was evicted"
            assert set(range(n_candidates, n)) <= kept, "a window token was evicted"
            mags = before["magnitudes"][b, h, case.n_sink:n_candidates]
            mags = torch.where(torch.isnan(mags), float("-inf"), mags)  # NaN is never protected
            n_large = max(0, case.n_protect - case.n_sink)
            order = torch.sort(mags, descending=True, stable=True).indices[:n_large] + case.n_sink
            assert set(order.tolist()) <= kept, "a value-protected token was evicted"
            for name in ("keys", "values", "magnitudes"):
                assert torch.equal(bits(after[name][b, h, :budget]), bits(before[name][b, h, src])), name
            expected_scores = before["scores"][b, h, src] if case.keep_scores else torch.zeros(budget)
            assert torch.equal(after["scores"][b, h, :budget], expected_scores)
            assert bool((after["scores"][b, h, budget:] == 0).all())


def check_matches_reference(case: Case, state, got, want) -> None:
    """Same survivors and bit-identical buffers, up to log-rounding ties (see module docstring)."""
    got = {name: tensor.cpu() for name, tensor in got.items()}
    want = {name: tensor.cpu() for name, tensor in want.items()}
    assert torch.equal(got["lengths"], want["lengths"])
    keys = reference.gumbel_keys(state["importance"].cpu(), state["noise"].cpu(), case.temperature)
    for b in range(case.batch):
        for h in range(case.kv_heads):
            if torch.equal(got["positions"][b, h], want["positions"][b, h]):
                for name in ("keys", "values", "scores", "magnitudes"):
                    assert torch.equal(bits(got[name][b, h]), bits(want[name][b, h])), (b, h, name)
                continue
            assert case.temperature > 0, f"row {(b, h)}: deterministic selections differ"
            pos_before = state["positions"][b, h].cpu()
            kept_got = set(got["positions"][b, h, : case.budget].tolist())
            kept_want = set(want["positions"][b, h, : case.budget].tolist())
            def selection_keys(slots_of: set) -> list[float]:
                return sorted(float(keys[b, h, int((pos_before == p).nonzero())]) for p in slots_of)

            # The slots only one side took, paired in key order with those only the other side
            # took: each pair must tie to within log's rounding.
            only_got, only_want = selection_keys(kept_got - kept_want), selection_keys(kept_want - kept_got)
            assert len(only_got) == len(only_want), (b, h, only_got, only_want)
            for key_got, key_want in zip(only_got, only_want):
                assert abs(key_got - key_want) <= 1e-5 * max(1.0, abs(key_want)), (b, h, only_got, only_want)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_eviction_invariants_and_reference(case: Case, device: torch.device, monkeypatch) -> None:
    poison_allocations(monkeypatch, eviction_kernels)
    state = make_state(case, device, seed=zlib.crc32(case.id.encode()))
    got = run(case, state)
    check_invariants(case, state, got)
    cpu_state = {name: tensor.cpu() for name, tensor in state.items()}
    want = run(case, cpu_state, op=reference.evict_)
    check_invariants(case, cpu_state, want)
    check_matches_reference(case, cpu_state, got, want)


def _random_case(rng: torch.Generator) -> Case:
    def pick(options):
        return options[int(torch.randint(len(options), (1,), generator=rng))]

    slots = pick([24, 63, 111, 130])
    window = pick([1, 4, 16])
    budget = int(torch.randint(window + 1, slots + 1, (1,), generator=rng))
    n_sink = min(pick([0, 1, 4]), budget - window)
    n_protect = int(torch.randint(0, budget - window + 1, (1,), generator=rng))
    trigger = int(torch.randint(budget, slots + 1, (1,), generator=rng))
    batch = pick([1, 2, 3])
    lengths = tuple(int(torch.randint(1, slots + 1, (1,), generator=rng)) for _ in range(batch - 1)) + (slots,)
    return Case(
        batch, pick([1, 2, 4]), slots, pick([32, 64, 128]), pick(list(DTYPE_NAMES)), budget, window, n_sink,
        n_protect, pick([0.0, 0.3, 1.0]), lengths, trigger_length=trigger, keep_scores=pick([False, True]),
    )


SWEEP = [_random_case(torch.Generator().manual_seed(1000 + i)) for i in range(10)]


@pytest.mark.parametrize("case", SWEEP, ids=[c.id for c in SWEEP])
def test_eviction_seeded_sweep(case: Case, device: torch.device) -> None:
    state = make_state(case, device, seed=17)
    got = run(case, state)
    check_invariants(case, state, got)
    cpu_state = {name: tensor.cpu() for name, tensor in state.items()}
    check_matches_reference(case, cpu_state, got, run(case, cpu_state, op=reference.evict_))


TOPK_CASE = Case(2, 4, 111, 64, torch.float32, 57, 8, 0, 0, 0.0, (111, 111))


@pytest.mark.parametrize("ties", [False, True], ids=["distinct", "ties"])
def test_temperature_zero_is_topk(ties: bool, device: torch.device) -> None:
    case = TOPK_CASE
    state = make_state(case, device, seed=5)
    importance = torch.rand(state["importance"].shape, generator=torch.Generator().manual_seed(9))
    if ties:
        importance = (importance * 4).floor() / 4  # four distinct values, many ties, some zeros
    state["importance"] = importance.to(device)
    got = run(case, state, temperature=0.0)
    n_candidates = case.slots - case.window
    k = case.budget - case.window
    cand = importance[:, :, :n_candidates]
    if ties:
        expected = torch.sort(cand, dim=-1, descending=True, stable=True).indices[..., :k]
    else:
        expected = torch.topk(cand, k, dim=-1).indices
    expected = torch.sort(expected, dim=-1).values
    kept = got["positions"][:, :, :k].cpu() - state["positions"][:, :, :1].cpu()
    assert torch.equal(kept // 3, expected.to(kept.dtype))


def test_zero_importance_taken_last(device: torch.device) -> None:
    """With sampling, zero-importance candidates fill the budget only after every positive one, earliest first."""
    case = Case(1, 4, 63, 64, torch.float16, 40, 8, 0, 0, 1.0, (63,))
    state = make_state(case, device, seed=11)
    importance = torch.zeros(state["importance"].shape)
    positive = torch.tensor([3, 10, 11, 30, 50])
    importance[..., positive] = torch.rand(1, 4, 5, generator=torch.Generator().manual_seed(2)) + 0.1
    state["importance"] = importance.to(device)
    got = run(case, state)
    k = case.budget - case.window
    zeros_needed = k - len(positive)
    zero_slots = [s for s in range(case.slots - case.window) if s not in positive.tolist()][:zeros_needed]
    expected = torch.tensor(sorted(positive.tolist() + zero_slots))
    kept = (got["positions"][0, :, :k].cpu() - state["positions"][0, :, :1].cpu()) // 3
    assert torch.equal(kept, expected.expand(4, k).to(kept.dtype))


def test_custom_op_schema_and_fake(device: torch.device) -> None:
    from vase_triton.ops.eviction import _evict_op

    case = CASES[3]
    state = make_state(case, device, seed=3)
    args = (
        *cache_of(state), state["importance"], state["noise"],
        case.budget, case.window, case.n_sink, case.n_protect, case.temperature, 7,
        torch.tensor([2], device=device), False, case.trigger,
    )
    torch.library.opcheck(_evict_op.op, args, test_utils=("test_schema", "test_faketensor"))


BAD_ARGUMENTS = [
    ("budget", dict(budget=8), ValueError),
    ("budget", dict(budget=64), ValueError),
    ("window", dict(window=0), ValueError),
    ("n_protect", dict(n_protect=30), ValueError),
    ("n_sink", dict(n_sink=-1), ValueError),
    ("trigger_length", dict(trigger_length=20), ValueError),
    ("temperature", dict(temperature=-1.0), ValueError),
    ("seed", dict(seed=2**63), ValueError),
    ("seed", dict(seed=-1), ValueError),
    ("budget", dict(budget=30.0), TypeError),
    ("keep_scores", dict(keep_scores=1), TypeError),
    ("eviction_index", dict(eviction_index=torch.zeros(1, dtype=torch.int32)), TypeError),
    ("eviction_index", dict(eviction_index=torch.zeros(2, dtype=torch.int64)), ValueError),
]


@pytest.mark.parametrize(
    "name,override,error", BAD_ARGUMENTS, ids=[f"{n}-{list(o.values())[0]}" for n, o, _ in BAD_ARGUMENTS]
)
def test_rejects_bad_arguments(name: str, override: dict, error: type) -> None:
    case = Case(1, 2, 63, 64, torch.float32, 37, 8, 4, 6, 1.0, (63,))
    state = make_state(case, torch.device("cpu"), seed=1)
    with pytest.raises(error, match=name):
        run(case, state, **override)


BAD_TENSORS = [
    ("scores", lambda s: s["scores"].double()),
    ("positions", lambda s: s["positions"].long()),
    ("importance", lambda s: s["importance"][:, :, :-1]),
    ("values", lambda s: s["values"].half()),
    ("noise", lambda s: s["noise"][:, :1]),
    ("lengths", lambda s: s["lengths"].long()),
    ("lengths", lambda s: s["lengths"][None]),
    ("keys", lambda s: s["keys"][..., :48]),
]


@pytest.mark.parametrize("name,corrupt", BAD_TENSORS, ids=[f"{n}{i}" for i, (n, _) in enumerate(BAD_TENSORS)])
def test_rejects_bad_tensors(name: str, corrupt) -> None:
    case = Case(1, 2, 63, 64, torch.float32, 37, 8, 4, 6, 1.0, (63,))
    state = make_state(case, torch.device("cpu"), seed=1)
    state[name] = corrupt(state)
    if name == "keys":
        state["values"] = state["values"][..., :48]
    with pytest.raises((ValueError, TypeError), match=name):
        run(case, state)


def test_strided_lengths_are_refused_before_anything_is_written() -> None:
    """The kernels index the `[B]` counters without strides: a strided view must not reach them."""
    case = Case(2, 2, 63, 64, torch.float32, 37, 8, 4, 6, 1.0, (63, 20))
    state = make_state(case, torch.device("cpu"), seed=1)
    state["lengths"] = torch.stack([state["lengths"], torch.full_like(state["lengths"], 99)], dim=1)[:, 0]
    before = {name: tensor.clone() for name, tensor in state.items()}
    with pytest.raises(ValueError, match=r"cache.lengths: expected a contiguous tensor"):
        evict_(cache_of(state), state["importance"], budget=case.budget, window=case.window, n_sink=case.n_sink,
               n_protect=case.n_protect, temperature=case.temperature, seed=7)
    assert all(torch.equal(bits(state[name]), bits(before[name])) for name in before)


def test_lengths_past_capacity_act_as_capacity(device: torch.device) -> None:
    """Lengths are not read back for validation; out-of-range values must not corrupt memory."""
    case = Case(2, 2, 63, 64, torch.float16, 37, 8, 4, 6, 1.0, (63, 63))
    state = make_state(case, device, seed=4)
    want = run(case, state)
    state["lengths"] = torch.tensor([63 + 50, 63], dtype=torch.int32, device=device)
    got = run(case, state)
    for name in ("keys", "values", "scores", "magnitudes", "positions", "lengths"):
        assert torch.equal(bits(got[name]), bits(want[name])), name
    cpu_state = {name: tensor.cpu() for name, tensor in state.items()}
    check_matches_reference(case, cpu_state, got, run(case, cpu_state, op=reference.evict_))


def test_traceable_by_torch_compile(device: torch.device) -> None:
    """Eviction runs eagerly in practice, but a compiled caller gets the same result."""
    case = Case(2, 2, 24, 32, torch.float32, 12, 4, 1, 2, 1.0, (24, 10))
    state = make_state(case, device, seed=8)

    def evict_and_sum(cache: CacheTensors, importance: torch.Tensor):
        evict_(
            cache, importance, budget=case.budget, window=case.window, n_sink=case.n_sink,
            n_protect=case.n_protect, temperature=case.temperature, seed=11,
        )
        return cache.positions.sum()

    eager = {name: tensor.clone() for name, tensor in state.items()}
    compiled = {name: tensor.clone() for name, tensor in state.items()}
    evict_and_sum(cache_of(eager), eager["importance"])
    torch.compile(evict_and_sum, fullgraph=True, backend="aot_eager")(cache_of(compiled), compiled["importance"])
    for name in CacheTensors._fields:
        assert torch.equal(bits(compiled[name]), bits(eager[name])), name


TILED_CASES = [
    Case(2, 3, 111, 64, torch.float16, 57, 8, 4, 20, 1.0, (111, 80), trigger_length=58),
    Case(1, 2, 257, 32, torch.float32, 129, 16, 0, 0, 0.0, (257,)),
    Case(3, 1, 63, 64, torch.bfloat16, 40, 4, 2, 2, 0.7, (63, 63, 12), keep_scores=True),
]


@pytest.mark.parametrize("case", TILED_CASES, ids=[c.id for c in TILED_CASES])
@pytest.mark.parametrize("drawn", [False, True], ids=["noise", "philox"])
def test_tiled_selection_for_long_rows_equals_the_in_register_one(case, drawn, device, monkeypatch) -> None:
    """Rows longer than the in-register limit take the tiled kernel: same draws, same survivors
    (the reference's, given the noise)."""
    poison_allocations(monkeypatch, eviction_kernels)
    state = make_state(case, device, seed=23)
    overrides = dict(noise=None) if drawn else {}
    resident = run(case, state, **overrides)
    monkeypatch.setattr(eviction_kernels, "_MAX_RESIDENT_SLOTS", 16)
    monkeypatch.setattr(eviction_kernels, "_TILED_BLOCK_N", 16)
    tiled = run(case, state, **overrides)
    check_invariants(case, state, tiled)
    for name in CacheTensors._fields:
        assert torch.equal(bits(tiled[name]), bits(resident[name])), name
    if not drawn:  # the reference draws from its own stream, not philox: comparable given the noise only
        cpu_state = {name: tensor.cpu() for name, tensor in state.items()}
        check_matches_reference(case, cpu_state, tiled, run(case, cpu_state, op=reference.evict_))


@pytest.mark.parametrize("tiled", [False, True], ids=["in-register", "tiled"])
def test_ragged_batch_with_empty_and_single_token_rows_matches_the_reference(tiled, device, monkeypatch) -> None:
    """Rows of 257, 0, 1 and 180 tokens (trigger 101): the two long rows are evicted in both
    selection kernels (257 slots: three 128-slot tiles, the last holding one), the short ones
    are left alone; the scratch is poisoned, the survivors are the reference's."""
    case = Case(4, 2, 257, 32, torch.float32, 100, 16, 2, 12, 1.0, (257, 0, 1, 180), trigger_length=101)
    poison_allocations(monkeypatch, eviction_kernels)
    if tiled:
        monkeypatch.setattr(eviction_kernels, "_MAX_RESIDENT_SLOTS", 16)
        monkeypatch.setattr(eviction_kernels, "_TILED_BLOCK_N", 128)
    assert eviction_kernels.uses_tiled_selection(case.slots, case.window) == tiled
    state = make_state(case, device, seed=31)
    got = run(case, state)
    check_invariants(case, state, got)
    cpu_state = {name: tensor.cpu() for name, tensor in state.items()}
    check_matches_reference(case, cpu_state, got, run(case, cpu_state, op=reference.evict_))


def test_decode_evictions_up_to_budget_8192_select_in_registers() -> None:
    """The in-register selection holds the candidates only: a `budget + window` row of budget 8192 fits."""
    assert not eviction_kernels.uses_tiled_selection(8192 + 64, 64)
    assert eviction_kernels.uses_tiled_selection(8192 + 65, 64)


@pytest.mark.parametrize("temperature", [1e-39, 1e-31])
def test_temperatures_below_the_floor_select_the_top_k_in_both_implementations(temperature, device) -> None:
    case = dataclasses.replace(TOPK_CASE, temperature=temperature)
    state = make_state(case, device, seed=5)
    topk = run(case, state, temperature=0.0)
    for op in (evict_, reference.evict_):
        got = run(case, state, op=op, noise=None)
        assert torch.equal(got["positions"].cpu(), topk["positions"].cpu()), op.__module__


@pytest.mark.parametrize("probes", [2, 16])
@pytest.mark.parametrize("tiled", [False, True], ids=["in-register", "tiled"])
def test_every_number_of_probes_selects_what_bisection_does(probes: int, tiled: bool, device, monkeypatch) -> None:
    """The threshold search with several probes a round finds the same threshold as bisection
    (one probe), or stops at one with exactly as many keys above: the same survivors, to the bit."""
    cases = TILED_CASES if tiled else CASES
    if tiled:
        monkeypatch.setattr(eviction_kernels, "_MAX_RESIDENT_SLOTS", 16)
        monkeypatch.setattr(eviction_kernels, "_TILED_BLOCK_N", 16)
    for index, case in enumerate(cases):
        state = make_state(case, device, seed=40 + index)
        bisected = run(case, state)
        with monkeypatch.context() as patch:
            for name in ("select_heuristic", "tiled_select_heuristic"):
                heuristic = getattr(eviction_kernels, name)
                patch.setattr(eviction_kernels, name, lambda shape, h=heuristic: h(shape)._replace(probes=probes))
            probed = run(case, state)
        check_invariants(case, state, probed)
        for name in CacheTensors._fields:
            assert torch.equal(bits(probed[name]), bits(bisected[name])), (case.id, name)


@pytest.mark.parametrize("probes", [1, 4, 16])
@pytest.mark.parametrize("tiled", [False, True], ids=["in-register", "tiled"])
def test_thresholds_at_either_end_of_a_row_range_select_what_the_reference_does(probes, tiled, device, monkeypatch):
    """The search starts from each row's least and largest eligible key, so the thresholds that
    sit on them are the edge cases: row 0 keeps fewer of its top keys than tie there (magnitudes
    and importance of two levels each), row 1 holds exactly `budget` tokens and keeps every
    candidate (the thresholds are its least keys). Deterministic selection: bit-identical."""
    case = Case(2, 2, 63, 32, torch.float32, 40, 8, 2, 5, 0.0, (63, 40), trigger_length=40)
    if tiled:
        monkeypatch.setattr(eviction_kernels, "_MAX_RESIDENT_SLOTS", 16)
        monkeypatch.setattr(eviction_kernels, "_TILED_BLOCK_N", 16)
    assert eviction_kernels.uses_tiled_selection(case.slots, case.window) == tiled
    for name in ("select_heuristic", "tiled_select_heuristic"):
        heuristic = getattr(eviction_kernels, name)
        monkeypatch.setattr(eviction_kernels, name, lambda shape, h=heuristic: h(shape)._replace(probes=probes))
    state = make_state(case, device, seed=51)
    slot = torch.arange(case.slots, device=device)
    valid = slot.view(1, 1, -1) < state["lengths"].view(-1, 1, 1)
    few = (slot % 9 == 5).view(1, 1, -1)  # the lower level: most candidates tie at the top one
    shape = state["magnitudes"].shape
    state["magnitudes"] = torch.where(valid, torch.where(few, 0.5, 1.0), float("nan")).expand(shape).contiguous()
    state["importance"] = torch.where(valid, torch.where(few, 0.25, 0.75), float("nan")).expand(shape).contiguous()
    got = run(case, state, noise=None)
    check_invariants(case, state, got)
    cpu_state = {name: tensor.cpu() for name, tensor in state.items()}
    want = run(case, cpu_state, op=reference.evict_, noise=None)
    for name in CacheTensors._fields:
        assert torch.equal(bits(got[name].cpu()), bits(want[name])), name
