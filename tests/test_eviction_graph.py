"""Evictions replayed from one CUDA graph (`vase_triton.eviction_graph`) do exactly what eager ones do.

Two caches are fed the same tokens, layer by layer, through `VaSECache.begin_step` /
`attend` / `end_step`: one evicts eagerly, the other with `graph_evictions=True`. On
CUDA the second captures its evictions at the second one and replays them from then on;
every kernel is deterministic and the random draws are keyed by the device-side counter,
so after every step both hold bit-identical buffers, for each family of policies (window
scores recomputed or emitted, scores of all queries, Gaussian projections, uniform
sampling). A policy that reads the device back to the host cannot be captured: it warns
and stays eager, still identical. On CPU there is nothing to capture and the flag leaves
the evictions eager; what is checked on either device is what a capture forbids: the
device work of an eviction, traced op by op on the Triton path, reads no value back to the
host for any built-in policy (the reference, which seeds generators from the counter, does).
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from vase_triton.cache import VaSECacheLayer
from vase_triton.config import VaSEConfig
from vase_triton.eviction_graph import EvictionGraph, unsupported_reason
from vase_triton.integrations.hf_cache import VaSECache
from vase_triton.ops import library_op
from vase_triton.policies import POLICIES, Policy, get_policy, register_policy

LAYERS, BATCH, Q_HEADS, KV_HEADS, HEAD_DIM = 3, 2, 4, 2, 64
PROMPT, STEPS = 20, 40
SCALE = HEAD_DIM**-0.5
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")


def _tokens(device, dtype):
    """Queries `[T, B, Hq, 1, D]`, keys and values `[T, B, Hkv, 1, D]` for `PROMPT + STEPS` tokens."""
    gen = torch.Generator().manual_seed(0)
    tokens = PROMPT + STEPS
    make = lambda heads: torch.randn(tokens, BATCH, heads, 1, HEAD_DIM, generator=gen).to(device, dtype)  # noqa: E731
    return make(Q_HEADS), make(KV_HEADS), make(KV_HEADS)


def _cache(config: VaSEConfig, device, dtype) -> VaSECache:
    return VaSECache(
        config, num_layers=LAYERS, batch_size=BATCH, num_kv_heads=KV_HEADS, head_dim=HEAD_DIM, dtype=dtype,
        device=device, num_query_heads=Q_HEADS,
    )  # fmt: skip


def _step(cache: VaSECache, query, key, value, *, graph_evictions: bool, scale: float = SCALE) -> None:
    tokens = key.shape[2]
    cache.begin_step(tokens, graph_evictions=graph_evictions)
    for layer in range(LAYERS):
        cache.attend(layer, query, key, value, scale)
    cache.end_step(tokens)


def _prefill(cache: VaSECache, tokens) -> None:
    prompt = (t[:PROMPT].squeeze(3).permute(1, 2, 0, 3) for t in tokens)
    _step(cache, *prompt, graph_evictions=False)


def _assert_same_state(eager: VaSECache, replayed: VaSECache, step: int) -> None:
    for layer, (a, b) in enumerate(zip(eager.stores, replayed.stores)):
        assert a.n_evictions == b.n_evictions, (step, layer)
        assert int(b.eviction_counter.item()) == b.n_evictions, (step, layer)
        for name, x, y in zip(a.tensors._fields, a.tensors, b.tensors):
            assert torch.equal(x, y), f"step {step}, layer {layer}: {name} differs"


def _run_side_by_side(config: VaSEConfig, device, dtype=torch.bfloat16) -> VaSECache:
    tokens = _tokens(device, dtype)
    eager, replayed = _cache(config, device, dtype), _cache(config, device, dtype)
    for cache in (eager, replayed):
        _prefill(cache, tokens)
    for t in range(PROMPT, PROMPT + STEPS):
        step = tuple(x[t] for x in tokens)
        _step(eager, *step, graph_evictions=False)
        _step(replayed, *step, graph_evictions=True)
        _assert_same_state(eager, replayed, t)
    assert replayed.n_evictions >= 3
    return replayed


CONFIGS = {
    "vase-recompute": VaSEConfig(policy="vase", budget=24, window=8, n_sink=2, seed=3),
    "vase-emitted": VaSEConfig(policy="vase", budget=24, window=8, n_sink=2, seed=3, score_mode="emitted"),
    "h2o": VaSEConfig(policy="h2o", budget=24, window=8, n_sink=2),
    "vase-dkv": VaSEConfig(policy="vase-dkv", budget=24, window=8, n_sink=2, dkv_rank=4, seed=5),
    "rkv": VaSEConfig(policy="rkv", budget=24, window=8, n_sink=2),
    "random": VaSEConfig(policy="random", budget=24, window=8, n_sink=2, seed=7),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_graph_evictions_match_eager_ones(name, device, monkeypatch) -> None:
    if device.type == "cpu":  # eager on both sides: the reference keeps this check quick
        monkeypatch.setenv("VASE_BACKEND", "torch")
    replayed = _run_side_by_side(CONFIGS[name], device)
    graph = replayed.eviction_graph
    if device.type == "cuda":
        assert graph is not None and graph.failure is None and graph.replaying
    else:
        assert graph is None  # nothing to capture on the CPU: the evictions stayed eager


def _host_reading_importance(config, inputs):
    if float(inputs.cache.lengths.max().item()) < 0:  # a read back to the host, which no capture allows
        raise AssertionError("lengths are never negative")
    return get_policy("streaming").importance(config, inputs)


@needs_cuda
def test_a_policy_that_reads_back_warns_and_stays_eager(device) -> None:
    policy = Policy("host-reading", _host_reading_importance, "nothing", stochastic=False, protect_values=False,
                    summary="streaming, reading lengths back to the host")
    register_policy(policy, replace=True)
    config = VaSEConfig(policy="host-reading", budget=24, window=8, n_sink=2)
    caller_stream = torch.cuda.current_stream(device)
    with pytest.warns(RuntimeWarning, match="could not be captured in a CUDA graph"):
        replayed = _run_side_by_side(config, device)
    assert replayed.eviction_graph.failure is not None and not replayed.eviction_graph.replaying
    # The failed capture gave the caller its stream back: later work is not left on the capture stream.
    assert torch.cuda.current_stream(device) == caller_stream


@needs_cuda
def test_a_new_scale_is_captured_anew(device) -> None:
    config = CONFIGS["vase-recompute"]
    replayed = _run_side_by_side(config, device)
    graph = replayed.eviction_graph
    first = graph.graph
    for store in replayed.stores:
        store.scale = SCALE / 2
    assert not graph.replaying
    tokens = _tokens(device, torch.bfloat16)
    for t in range(PROMPT, PROMPT + config.window + 1):
        _step(replayed, *(x[t] for x in tokens), graph_evictions=True, scale=SCALE / 2)
    assert graph.replaying and graph.graph is not first


def test_unsupported_layouts_are_named(device) -> None:
    config = CONFIGS["vase-recompute"]
    cpu = _cache(config, "cpu", torch.float32)
    assert unsupported_reason(cpu.stores) == "the layers are on cpu, not CUDA"
    assert unsupported_reason([]) == "no layers"
    with pytest.raises(ValueError, match="stores: expected evicting layers on one CUDA device; the layers are on cpu"):
        EvictionGraph(cpu.stores)
    if device.type == "cuda":
        full = VaSECache(
            config.replace(policy="full"), num_layers=2, batch_size=1, num_kv_heads=1, head_dim=64,
            dtype=torch.float32, device=device, max_length=8,
        )  # fmt: skip
        assert unsupported_reason(full.stores) == "the policy never evicts"


class _HostReads(TorchDispatchMode):
    """Records the ops that read a tensor's value back to the host or size their output by it."""

    READS = ("aten._local_scalar_dense", "aten.is_nonzero", "aten.equal", "aten.nonzero", "aten.masked_select",
             "aten.unique", "aten._unique")

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if str(func).startswith(self.READS):
            self.reads.append(str(func))
        return func(*args, **(kwargs or {}))


def _host_reads_of_one_eviction(policy: str, monkeypatch, device: torch.device) -> list[str]:
    # Let the library's ops run their functions under the mode, so that it sees inside them.
    monkeypatch.setattr(library_op, "_needs_dispatcher", lambda args: False)
    config = VaSEConfig(policy=policy, budget=24, window=8, n_sink=2)
    layer = VaSECacheLayer(config, batch_size=2, num_kv_heads=2, head_dim=64, dtype=torch.float32, device=device,
                           num_query_heads=4)
    gen = torch.Generator().manual_seed(0)
    query = torch.randn(2, 4, 32, 64, generator=gen).to(device)
    key = torch.randn(2, 2, 32, 64, generator=gen).to(device)
    layer.prefill(query, key, key, scale=SCALE)  # 32 tokens: the layer is full
    with _HostReads() as probe:
        layer.evict_on_device()
    assert int(layer.eviction_counter.item()) == 1 and bool((layer.lengths == config.budget).all())
    return probe.reads


@pytest.mark.parametrize("policy", [name for name, spec in POLICIES.items() if spec.evicts])
def test_eviction_reads_nothing_back_on_the_kernel_path(policy, monkeypatch, device) -> None:
    monkeypatch.setenv("VASE_BACKEND", "triton")  # on CPU, the interpreter the test set-up enables
    assert _host_reads_of_one_eviction(policy, monkeypatch, device) == []


def test_the_probe_sees_the_reference_read_its_counter(monkeypatch, device) -> None:
    monkeypatch.setenv("VASE_BACKEND", "torch")
    assert "aten._local_scalar_dense.default" in _host_reads_of_one_eviction("vase", monkeypatch, device)
