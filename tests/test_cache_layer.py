"""`VaSECacheLayer`: eviction invariants over seeded random configurations, prompt compression,
left-padded batches, and exactness when nothing is evicted."""

from __future__ import annotations

import random

import pytest
import torch

from cache_testing import check_row_order, clone_buffers
from vase_triton import reference
from vase_triton.cache import VaSECacheLayer
from vase_triton.config import POLICIES, VaSEConfig

DTYPE_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}


def _random_run(batch, q_heads, kv_heads, tokens, head_dim, dtype, seed):
    """Queries, keys and heavy-tailed values of a whole run: `[B, H, tokens, D]`."""
    gen = torch.Generator().manual_seed(seed)
    query = torch.randn(batch, q_heads, tokens, head_dim, generator=gen)
    key = torch.randn(batch, kv_heads, tokens, head_dim, generator=gen)
    spread = torch.exp(2 * torch.rand(batch, kv_heads, tokens, 1, generator=gen))
    value = torch.randn(batch, kv_heads, tokens, head_dim, generator=gen) * spread
    return query.to(dtype), key.to(dtype), value.to(dtype)


def _check_eviction(layer, before, all_keys, all_values, old_lengths) -> None:
    """Invariants of one eviction, given the buffers right before it.

    `all_keys`/`all_values` `[B, Hkv, P, D]` hold every token ever appended at its position.
    """
    config = layer.config
    budget, window, n_sink = config.budget, config.window, config.n_sink
    n_large = max(0, config.resolved_n_protect - n_sink)  # sinks count among the protected
    check_row_order(layer)
    for b in range(layer.batch_size):
        n = int(old_lengths[b])
        if n <= budget:
            for name in ("keys", "values", "magnitudes", "positions"):
                assert torch.equal(getattr(layer, name)[b], before[name][b]), f"row {b}: {name} changed"
            assert int(layer.lengths[b]) == n
            continue
        assert int(layer.lengths[b]) == budget
        for h in range(layer.num_kv_heads):
            kept = layer.positions[b, h, :budget].long()
            old_positions = before["positions"][b, h, :n].long()
            assert torch.equal(kept[:n_sink], old_positions[:n_sink]), "a sink was evicted"
            assert torch.equal(kept[budget - window :], old_positions[n - window :]), "a window token was evicted"
            if n_large > 0:
                candidates = before["magnitudes"][b, h, n_sink : n - window]
                cand_positions = old_positions[n_sink : n - window]
                threshold = candidates.topk(n_large).values[-1]
                must_keep = cand_positions[candidates > threshold]
                assert bool(torch.isin(must_keep, kept).all()), "a value-protected token was evicted"
                at_least = torch.isin(cand_positions[candidates >= threshold], kept).sum()
                assert int(at_least) >= n_large
            # Survivors are bit-identical to what was appended; magnitudes moved with them.
            assert torch.equal(layer.keys[b, h, :budget], all_keys[b, h, kept])
            assert torch.equal(layer.values[b, h, :budget], all_values[b, h, kept])
            source_slot = torch.searchsorted(old_positions, kept)
            assert torch.equal(layer.magnitudes[b, h, :budget], before["magnitudes"][b, h, source_slot])
            if config.policy == "h2o":
                assert torch.equal(layer.scores[b, h, :budget], before["scores"][b, h, source_slot])
                assert bool((layer.scores[b, h, budget:] == 0).all())
    if config.policy != "h2o":
        assert bool((layer.scores == 0).all()), "scores must restart empty after an eviction"


def _sweep_configs(count: int, seed: int):
    """Seeded random configurations; every evicting policy, dtype, D and GQA ratio appears."""
    rng = random.Random(seed)
    policies = [p for p in POLICIES if p != "full"]
    dtypes = list(DTYPE_NAMES)
    configs = []
    for index in range(count):
        window = rng.choice([4, 5, 8])
        budget = rng.randint(max(16, 3 * window), 40)
        policy = policies[index % len(policies)]
        n_sink = rng.randint(0, 4)
        temperatures = {"vase": [1.0, 0.5, 0.0], "random": [1.0, 0.5]}.get(policy, [1.0])
        config = VaSEConfig(
            policy=policy, budget=budget, window=window, n_sink=n_sink,
            value_stat=rng.choice(["range", "absmax", "l2", "var"]),
            temperature=rng.choice(temperatures),
            n_protect=rng.choice([None, budget // 8]) if policy == "vase" else None,
            score_mode=rng.choice(["emitted", "recompute"]),
            seed=rng.randint(0, 1000),
        )
        kv_heads = rng.choice([1, 2])
        group = [1, 2, 4, 8][index % 4]
        # Prompt kinds cycle so that each policy meets short prompts and prompts longer than C.
        prompt = [1, window + 3, budget + window - 1, budget + window + 7][(index + 3 * (index // len(policies))) % 4]
        configs.append(
            dict(
                config=config, batch=rng.randint(1, 3), kv_heads=kv_heads, q_heads=kv_heads * group,
                head_dim=[64, 128][index % 2], dtype=dtypes[index % 3], prompt=prompt,
                seed=rng.randint(0, 10_000),
            )
        )
    return configs


def _sweep_id(case) -> str:
    c = case["config"]
    return (
        f"{c.policy}-B{case['batch']}-Hq{case['q_heads']}-Hkv{case['kv_heads']}-T{case['prompt']}-D{case['head_dim']}"
        f"-{DTYPE_NAMES[case['dtype']]}-budget{c.budget}-window{c.window}-sink{c.n_sink}-protect{c.resolved_n_protect}"
        f"-tau{c.eviction_temperature}-{c.value_stat}-{c.score_mode}"
    )


SWEEP = _sweep_configs(16, seed=2024)
# The Triton path (interpreted on CPU) is exercised on a subset; the rest runs the reference ops.
TRITON_SWEEP = {0, 5}


@pytest.mark.parametrize("index", range(len(SWEEP)), ids=[_sweep_id(c) for c in SWEEP])
def test_invariants_after_every_eviction(index, device, monkeypatch):
    case = SWEEP[index]
    if index not in TRITON_SWEEP:
        monkeypatch.setenv("VASE_BACKEND", "torch")
    config = case["config"]
    layer = VaSECacheLayer(
        config, batch_size=case["batch"], num_kv_heads=case["kv_heads"], head_dim=case["head_dim"],
        dtype=case["dtype"], device=device,
    )
    prompt = case["prompt"]
    steps = config.capacity - min(prompt, config.budget) + 2 * config.window + 2
    if index in TRITON_SWEEP:
        steps = config.capacity - min(prompt, config.budget) + 2
    query, key, value = (t.to(device) for t in _random_run(
        case["batch"], case["q_heads"], case["kv_heads"], prompt + steps, case["head_dim"], case["dtype"], case["seed"]
    ))
    scale = case["head_dim"] ** -0.5

    layer.prefill(query[:, :, :prompt], key[:, :, :prompt], value[:, :, :prompt], scale=scale)
    check_row_order(layer)
    assert layer.length_bound == (min(prompt, config.budget) if prompt > config.capacity else prompt)
    if prompt > config.capacity:
        # Prompt compression: same invariants against the prompt itself.
        prompt_state = {
            "positions": torch.arange(prompt, dtype=torch.int32, device=device).expand(case["batch"], case["kv_heads"], prompt),
            "magnitudes": reference.value_magnitude(value[:, :, :prompt], config.value_stat),
        }
        for b in range(case["batch"]):
            for h in range(case["kv_heads"]):
                kept = layer.positions[b, h, : config.budget].long()
                assert torch.equal(kept[: config.n_sink], torch.arange(config.n_sink, device=device))
                assert torch.equal(kept[config.budget - config.window :], torch.arange(prompt - config.window, prompt, device=device))
                assert torch.equal(layer.keys[b, h, : config.budget], key[b, h, kept])
                assert torch.equal(layer.values[b, h, : config.budget], value[b, h, kept])
                n_large = max(0, config.resolved_n_protect - config.n_sink)
                if n_large:
                    candidates = prompt_state["magnitudes"][b, h, config.n_sink : prompt - config.window]
                    threshold = candidates.topk(n_large).values[-1]
                    must_keep = torch.arange(config.n_sink, prompt - config.window, device=device)[candidates > threshold * (1 + 1e-5)]
                    assert bool(torch.isin(must_keep, kept).all())
        assert bool((layer.lengths == config.budget).all())

    evictions = layer.n_evictions
    for step in range(prompt, prompt + steps):
        if layer.length_bound == layer.capacity:
            before = clone_buffers(layer)
            old_lengths = layer.lengths.clone()
            assert bool((old_lengths == layer.capacity).all())
            layer.evict()
            _check_eviction(layer, before, key, value, old_lengths)
            assert layer.length_bound == config.budget
        layer.prepare_decode_step()
        q, k, v = query[:, :, step : step + 1], key[:, :, step : step + 1], value[:, :, step : step + 1]
        out = layer.decode_step(q, k, v, scale=scale)
        assert bool(torch.isfinite(out).all())
    assert layer.n_evictions > evictions
    check_row_order(layer)


def test_ragged_prompt_compression_and_untouched_short_rows(device, monkeypatch):
    """Rows longer than C are compressed at prefill; rows at or below budget are stored whole."""
    monkeypatch.setenv("VASE_BACKEND", "torch")
    config = VaSEConfig(policy="vase", budget=24, window=6, n_sink=3)
    batch, prompt = 3, 41
    query, key, value = _random_run(batch, 4, 2, prompt, 64, torch.float32, seed=11)
    valid = torch.tensor([41, 9, 27], dtype=torch.int32)
    layer = VaSECacheLayer(config, batch_size=batch, num_kv_heads=2, head_dim=64, dtype=torch.float32, device=device)
    out = layer.prefill(*(t.to(device) for t in (query, key, value)), scale=0.125, valid_lengths=valid.to(device))
    assert bool((out[1, :, : prompt - 9] == 0).all()) and bool((out[2, :, : prompt - 27] == 0).all())
    # Row 0 (41 > C = 30) and row 2 (budget < 27 <= C, evicted with the batch) hold budget tokens.
    assert layer.lengths.tolist() == [24, 9, 24]
    assert layer.length_bound == config.budget
    check_row_order(layer)
    # Row 1: its 9 real tokens, left-aligned, padding never stored.
    assert torch.equal(layer.keys[1, :, :9], key[1, :, prompt - 9 :].to(device))
    assert bool((layer.positions[1, :, :9] == torch.arange(9, device=device, dtype=torch.int32)).all())
    assert bool((layer.positions[1, :, 9:] == -1).all())
    # Compressed rows keep sinks (their first real tokens) and the last window.
    for b, n in ((0, 41), (2, 27)):
        real_keys = key[b, :, prompt - n :].to(device)
        kept = layer.positions[b].long()[:, : config.budget]
        assert bool((kept[:, : config.n_sink] == torch.arange(config.n_sink, device=device)).all())
        assert bool((kept[:, -config.window :] == torch.arange(n - config.window, n, device=device)).all())
        for h in range(2):
            assert torch.equal(layer.keys[b, h, : config.budget], real_keys[h, kept[h]])


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_left_padded_rows_match_unpadded_runs(device, monkeypatch, backend):
    """Each row of a left-padded batch ends with the cache and outputs of its own unpadded run."""
    if backend == "torch":
        monkeypatch.setenv("VASE_BACKEND", "torch")
    config = VaSEConfig(policy="snapkv", budget=20, window=4, n_sink=2, value_stat="absmax")
    prompt, decode_steps, head_dim = 31, 3, 64
    valid = [31, 7, 26]  # compressed (> C = 24), stored whole, compressed
    batch = len(valid)
    query, key, value = (t.to(device) for t in _random_run(batch, 2, 1, prompt + decode_steps, head_dim, torch.float32, seed=5))
    padded_q, padded_k, padded_v = (torch.zeros_like(t) for t in (query, key, value))
    for b, n in enumerate(valid):
        for padded, real in ((padded_q, query), (padded_k, key), (padded_v, value)):
            padded[b, :, prompt - n : prompt] = real[b, :, :n]
            padded[b, :, prompt:] = real[b, :, n : n + decode_steps]

    def make(batch_size):
        return VaSECacheLayer(config, batch_size=batch_size, num_kv_heads=1, head_dim=head_dim, dtype=torch.float32, device=device)

    layer = make(batch)
    lengths = torch.tensor(valid, dtype=torch.int32, device=device)
    padded_out = layer.prefill(padded_q[:, :, :prompt], padded_k[:, :, :prompt], padded_v[:, :, :prompt], scale=0.125, valid_lengths=lengths)
    padded_steps = [
        layer.decode(padded_q[:, :, s : s + 1], padded_k[:, :, s : s + 1], padded_v[:, :, s : s + 1], scale=0.125)
        for s in range(prompt, prompt + decode_steps)
    ]
    for b, n in enumerate(valid):
        single = make(1)
        out = single.prefill(query[b : b + 1, :, :n], key[b : b + 1, :, :n], value[b : b + 1, :, :n], scale=0.125)
        torch.testing.assert_close(padded_out[b, :, prompt - n :], out[0], rtol=1e-5, atol=1e-6)
        for s in range(decode_steps):
            step = single.decode(*(t[b : b + 1, :, n + s : n + s + 1] for t in (query, key, value)), scale=0.125)
            torch.testing.assert_close(padded_steps[s][b], step[0], rtol=1e-5, atol=1e-6)
        length = int(single.lengths[0])
        assert int(layer.lengths[b]) == length
        assert int(layer.next_positions[b]) == int(single.next_positions[0])
        for name in ("keys", "values", "positions", "magnitudes"):
            assert torch.equal(getattr(layer, name)[b, :, :length], getattr(single, name)[0, :, :length]), name
        torch.testing.assert_close(layer.scores[b, :, :length], single.scores[0, :, :length], rtol=1e-5, atol=1e-6)
        assert bool((layer.positions[b, :, length:] == -1).all())


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("policy", ["snapkv", "vase"])
def test_padding_that_every_row_has_is_not_counted(device, monkeypatch, policy, backend):
    """Rows of 30 and 21 tokens padded to 40 (more than C = 32) evict as when padded to 30, their
    longest row: the columns every row pads are left out, so the prompt is not compressed, and
    the decode steps evict at the same steps, keeping the same tokens."""
    if backend == "torch":
        monkeypatch.setenv("VASE_BACKEND", "torch")
    config = VaSEConfig(policy=policy, budget=24, window=8, prefill_chunk_size=16, seed=4)
    longest, wide, steps, head_dim = 30, 40, 12, 32
    valid = torch.tensor([30, 21], dtype=torch.int32, device=device)
    query, key, value = (t.to(device) for t in _random_run(2, 4, 2, longest + steps, head_dim, torch.float32, seed=9))

    def run(width):
        layer = VaSECacheLayer(config, batch_size=2, num_kv_heads=2, head_dim=head_dim, dtype=torch.float32, device=device)
        padded = [torch.cat([t.new_zeros(*t.shape[:2], width - longest, head_dim), t[:, :, :longest]], dim=2) for t in (query, key, value)]
        prompt_output = layer.prefill(*padded, scale=0.125, valid_lengths=valid)
        assert bool((prompt_output[:, :, : width - longest] == 0).all())  # the queries no row holds
        outputs = [prompt_output[:, :, width - longest :]]
        states = [(int(layer.n_evictions), layer.lengths.tolist())]
        for s in range(longest, longest + steps):
            outputs.append(layer.decode(*(t[:, :, s : s + 1] for t in (query, key, value)), scale=0.125))
            states.append((int(layer.n_evictions), layer.lengths.tolist()))
        return layer, outputs, states

    narrow_layer, narrow_outputs, narrow_states = run(longest)
    wide_layer, wide_outputs, wide_states = run(wide)
    assert narrow_states[0] == (0, [30, 21])  # the prompt fits C
    assert wide_states == narrow_states
    assert sum(evictions > 0 for evictions, _ in narrow_states) > 0  # decoding evicts
    for narrow, wide in zip(narrow_outputs, wide_outputs):
        torch.testing.assert_close(wide, narrow, rtol=1e-5, atol=1e-6)
    for name in ("keys", "values", "positions", "magnitudes"):
        assert torch.equal(getattr(wide_layer, name), getattr(narrow_layer, name)), name


TOLERANCE_CASES = [
    ("vase", torch.float32, None, "torch"),
    ("full", torch.float16, [13, 6], "torch"),
    ("h2o", torch.bfloat16, None, "triton"),
    ("rkv", torch.float16, [9, 13], "triton"),
]


@pytest.mark.parametrize(
    "policy, dtype, valid, backend", TOLERANCE_CASES,
    ids=[f"{p}-B2-Hq4-Hkv2-T13-D64-{DTYPE_NAMES[d]}-{'ragged' if v else 'dense'}-{be}" for p, d, v, be in TOLERANCE_CASES],
)
def test_budget_larger_than_run_equals_full_attention(device, monkeypatch, policy, dtype, valid, backend):
    """Nothing is evicted: prefill and every decode output equal attention over all tokens so far."""
    if backend == "torch":
        monkeypatch.setenv("VASE_BACKEND", "torch")
    prompt, steps, head_dim, scale = 13, 6, 64, 0.125
    config = VaSEConfig(policy=policy, budget=40, window=4, n_sink=2)
    capacity = prompt + steps if policy == "full" else None
    layer = VaSECacheLayer(config, batch_size=2, num_kv_heads=2, head_dim=head_dim, dtype=dtype, device=device, capacity=capacity)
    query, key, value = (t.to(device) for t in _random_run(2, 4, 2, prompt + steps, head_dim, dtype, seed=3))
    valid = valid or [prompt, prompt]
    if valid != [prompt, prompt]:
        # Left-pad: row b's real prompt is its last valid[b] prompt tokens.
        for t in (query, key, value):
            for b, n in enumerate(valid):
                t[b, :, : prompt - n] = 0
    lengths = torch.tensor(valid, dtype=torch.int32, device=device)
    outputs = [layer.prefill(query[:, :, :prompt], key[:, :, :prompt], value[:, :, :prompt], scale=scale, valid_lengths=lengths)]
    outputs += [
        layer.decode(query[:, :, s : s + 1], key[:, :, s : s + 1], value[:, :, s : s + 1], scale=scale)
        for s in range(prompt, prompt + steps)
    ]
    assert layer.n_evictions == 0
    ours = torch.cat(outputs, dim=2)
    for b, n in enumerate(valid):
        real = slice(prompt - n, prompt + steps)
        q, k, v = (t[b : b + 1, :, real] for t in (query, key, value))
        truth, _, _ = reference.prefill_attention(q.double(), k.double(), v.double(), scale=scale)
        same_dtype, _, _ = reference.prefill_attention(q, k, v, scale=scale)
        torch_error = (same_dtype.double() - truth).abs().max()
        error = (ours[b : b + 1, :, real].double() - truth).abs().max()
        assert error <= 4 * torch_error + 8 * torch.finfo(dtype).eps, (float(error), float(torch_error))
        assert bool((ours[b, :, : prompt - n] == 0).all())
