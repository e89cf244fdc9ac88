"""`VaSECacheLayer` rejects bad input with a message naming the argument, and leaves the cache untouched."""

from __future__ import annotations

import pytest
import torch

from cache_testing import clone_buffers
from vase_triton.cache import VaSECacheLayer
from vase_triton.config import VaSEConfig

B, HQ, HKV, D = 2, 4, 2, 64
DTYPE = torch.float16
SCALE = D**-0.5


@pytest.fixture(autouse=True)
def _reference_backend(monkeypatch):
    """Validation is backend-independent: run the ops on the PyTorch reference for speed."""
    monkeypatch.setenv("VASE_BACKEND", "torch")


def _tensors(batch=B, heads=HKV, tokens=1, head_dim=D, dtype=DTYPE, device="cpu", seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(batch, heads, tokens, head_dim, generator=gen).to(dtype=dtype, device=device)


def _qkv(tokens, device, **overrides):
    query = overrides.pop("query", None)
    key = overrides.pop("key", None)
    value = overrides.pop("value", None)
    query = _tensors(heads=HQ, tokens=tokens, device=device, seed=1) if query is None else query
    key = _tensors(tokens=tokens, device=device, seed=2) if key is None else key
    value = _tensors(tokens=tokens, device=device, seed=3) if value is None else value
    return query, key, value


def _snapshot(layer: VaSECacheLayer):
    return clone_buffers(layer) | {
        "length_bound": layer.length_bound,
        "n_evictions": layer.n_evictions,
        "num_query_heads": layer.num_query_heads,  # fixed by the first call that stores tokens
        "scale": layer.scale,
    }


def _assert_untouched(layer: VaSECacheLayer, snapshot) -> None:
    for name, before in snapshot.items():
        now = getattr(layer, name)
        if isinstance(before, torch.Tensor):
            assert torch.equal(now, before), f"{name} changed"
        else:
            assert now == before, f"{name} changed"


@pytest.fixture
def filled_layer(device):
    """A snapkv layer (C = 24) holding a 5-token prompt."""
    layer = VaSECacheLayer(
        VaSEConfig(policy="snapkv", budget=16, window=8, n_sink=2),
        batch_size=B, num_kv_heads=HKV, head_dim=D, dtype=DTYPE, device=device,
    )
    layer.prefill(*_qkv(5, device), scale=SCALE)
    return layer


@pytest.fixture
def full_layer(device):
    """A `full` layer of capacity 6 holding 6 tokens: one more append would overflow."""
    layer = VaSECacheLayer(
        VaSEConfig(policy="full", budget=16, window=8, n_sink=2),
        batch_size=B, num_kv_heads=HKV, head_dim=D, dtype=DTYPE, device=device, capacity=6,
    )
    layer.prefill(*_qkv(6, device), scale=SCALE)
    return layer


def _bad_decode_inputs(device):
    meta = torch.device("meta")
    return {
        "query-rank": (dict(query=_tensors(heads=HQ, device=device)[0]), ValueError, "query"),
        "key-rank": (dict(key=_tensors(device=device)[:, :, 0]), ValueError, "key"),
        "value-dtype": (dict(value=_tensors(dtype=torch.float32, device=device)), TypeError, "value"),
        "query-dtype": (dict(query=_tensors(heads=HQ, dtype=torch.bfloat16, device=device)), TypeError, "query"),
        "key-device": (dict(key=_tensors(device=meta)), ValueError, "key"),
        "query-batch": (dict(query=_tensors(batch=B + 1, heads=HQ, device=device)), ValueError, "query"),
        "key-batch": (dict(key=_tensors(batch=1, device=device)), ValueError, "key"),
        "key-headdim": (dict(key=_tensors(head_dim=128, device=device)), ValueError, "key"),
        "query-headdim": (dict(query=_tensors(heads=HQ, head_dim=128, device=device)), ValueError, "query"),
        "key-kvheads": (dict(key=_tensors(heads=HKV * 2, device=device)), ValueError, "key"),
        "value-shape": (dict(value=_tensors(heads=1, device=device)), ValueError, "value"),
        "query-groups": (dict(query=_tensors(heads=3, device=device)), ValueError, "query"),
        "query-no-heads": (dict(query=_tensors(heads=0, device=device)), ValueError, r"query: expected a positive"),
        "key-tokens": (dict(query=_tensors(heads=HQ, tokens=2, device=device),
                            key=_tensors(tokens=2, device=device), value=_tensors(tokens=2, device=device)),
                       ValueError, "key"),
        "query-tokens": (dict(query=_tensors(heads=HQ, tokens=2, device=device)), ValueError, "query"),
    }


DECODE_CASES = [
    "query-rank", "key-rank", "value-dtype", "query-dtype", "key-device", "query-batch", "key-batch",
    "key-headdim", "query-headdim", "key-kvheads", "value-shape", "query-groups", "query-no-heads", "key-tokens",
    "query-tokens",
]


@pytest.mark.parametrize("case", DECODE_CASES)
def test_decode_rejects_bad_input(filled_layer, device, case):
    overrides, error, name = _bad_decode_inputs(device)[case]
    snapshot = _snapshot(filled_layer)
    with pytest.raises(error, match=name):
        filled_layer.decode(*_qkv(1, device, **overrides), scale=SCALE)
    _assert_untouched(filled_layer, snapshot)


@pytest.mark.parametrize("scale", [0.0, -1.0, float("nan"), float("inf"), "0.1"], ids=["zero", "neg", "nan", "inf", "str"])
def test_decode_rejects_bad_scale(filled_layer, device, scale):
    snapshot = _snapshot(filled_layer)
    with pytest.raises(ValueError, match="scale"):
        filled_layer.decode(*_qkv(1, device), scale=scale)
    _assert_untouched(filled_layer, snapshot)


def test_decode_past_capacity_without_eviction(full_layer, device):
    snapshot = _snapshot(full_layer)
    with pytest.raises(ValueError, match="capacity"):
        full_layer.decode(*_qkv(1, device), scale=SCALE)
    _assert_untouched(full_layer, snapshot)


def test_prefill_on_non_empty_layer(filled_layer, device):
    snapshot = _snapshot(filled_layer)
    with pytest.raises(ValueError, match="empty layer"):
        filled_layer.prefill(*_qkv(3, device), scale=SCALE)
    _assert_untouched(filled_layer, snapshot)


def test_prefill_longer_than_full_capacity(device):
    layer = VaSECacheLayer(
        VaSEConfig(policy="full", budget=16, window=8, n_sink=2),
        batch_size=B, num_kv_heads=HKV, head_dim=D, dtype=DTYPE, device=device, capacity=6,
    )
    snapshot = _snapshot(layer)
    with pytest.raises(ValueError, match="key"):
        layer.prefill(*_qkv(7, device), scale=SCALE)
    _assert_untouched(layer, snapshot)


@pytest.mark.parametrize(
    "valid_lengths, error",
    [
        ([3, 6], ValueError),  # more real tokens than T = 5
        ([3, -1], ValueError),
        ([3], ValueError),  # wrong batch
        ([3.0, 2.0], TypeError),
    ],
    ids=["too-long", "negative", "wrong-batch", "float"],
)
def test_prefill_rejects_bad_valid_lengths(device, valid_lengths, error):
    layer = VaSECacheLayer(
        VaSEConfig(policy="snapkv", budget=16, window=8, n_sink=2),
        batch_size=B, num_kv_heads=HKV, head_dim=D, dtype=DTYPE, device=device,
    )
    snapshot = _snapshot(layer)
    lengths = torch.tensor(valid_lengths, device=device)
    if not lengths.is_floating_point():
        lengths = lengths.to(torch.int32)
    with pytest.raises(error, match="valid_lengths"):
        layer.prefill(*_qkv(5, device), scale=SCALE, valid_lengths=lengths)
    _assert_untouched(layer, snapshot)


def test_extend_refuses_padding_in_a_row_that_holds_tokens(device):
    """Its pad queries would attend to the row's tokens and add to their scores (h2o ranks by them)."""
    layer = VaSECacheLayer(
        VaSEConfig(policy="h2o", budget=16, window=8, n_sink=2),
        batch_size=B, num_kv_heads=HKV, head_dim=D, dtype=DTYPE, device=device,
    )
    layer.prefill(*_qkv(5, device), scale=SCALE, valid_lengths=torch.tensor([0, 5], dtype=torch.int32, device=device))
    snapshot = _snapshot(layer)
    with pytest.raises(ValueError, match=r"valid_lengths: expected 4 \(no padding\) for every row that holds tokens"):
        layer.extend(*_qkv(4, device), scale=SCALE, valid_lengths=torch.tensor([4, 1], dtype=torch.int32, device=device))
    _assert_untouched(layer, snapshot)
    # The row still empty may be padded.
    layer.extend(*_qkv(4, device), scale=SCALE, valid_lengths=torch.tensor([2, 4], dtype=torch.int32, device=device))
    assert layer.tensors.lengths.tolist() == [2, 9]


@pytest.mark.parametrize(
    "case", ["query-rank", "value-dtype", "key-device", "key-batch", "key-headdim", "key-kvheads", "query-no-heads"]
)
def test_prefill_rejects_bad_input(device, case):
    layer = VaSECacheLayer(
        VaSEConfig(policy="snapkv", budget=16, window=8, n_sink=2),
        batch_size=B, num_kv_heads=HKV, head_dim=D, dtype=DTYPE, device=device,
    )
    overrides, error, name = _bad_decode_inputs(device)[case]
    snapshot = _snapshot(layer)
    with pytest.raises(error, match=name):
        layer.prefill(*_qkv(1, device, **overrides), scale=SCALE)
    _assert_untouched(layer, snapshot)
    assert layer.num_query_heads is None  # the query state is sized by the first accepted prefill


@pytest.mark.parametrize(
    "kwargs, error, name",
    [
        (dict(config="vase"), TypeError, "config"),
        (dict(capacity=100), ValueError, "capacity"),
        (dict(head_dim=48), ValueError, "head_dim"),
        (dict(dtype=torch.float64), TypeError, "dtype"),
        (dict(batch_size=0), ValueError, "batch_size"),
        (dict(num_kv_heads=2.0), TypeError, "num_kv_heads"),
        (dict(config=VaSEConfig(policy="full", budget=16, window=8)), ValueError, "capacity"),
    ],
    ids=["config-type", "capacity-mismatch", "headdim", "dtype", "batch", "kvheads-type", "full-needs-capacity"],
)
def test_constructor_rejects_bad_arguments(device, kwargs, error, name):
    arguments = dict(
        config=VaSEConfig(policy="vase", budget=16, window=8, n_sink=2),
        batch_size=B, num_kv_heads=HKV, head_dim=D, dtype=DTYPE, device=device,
    )
    arguments.update(kwargs)
    config = arguments.pop("config")
    with pytest.raises(error, match=name):
        VaSECacheLayer(config, **arguments)


def test_evict_on_full_policy_is_rejected(full_layer):
    snapshot = _snapshot(full_layer)
    with pytest.raises(ValueError, match="policy"):
        full_layer.evict()
    _assert_untouched(full_layer, snapshot)


def test_a_refused_prefill_leaves_the_query_heads_open(device):
    """The first call that stores tokens sizes the query state: a refused one does not, so a
    valid prompt with another query-head count is taken afterwards."""
    layer = VaSECacheLayer(
        VaSEConfig(policy="snapkv", budget=16, window=8, n_sink=2),
        batch_size=B, num_kv_heads=HKV, head_dim=D, dtype=DTYPE, device=device,
    )
    wide = _tensors(heads=2 * HQ, tokens=5, device=device, seed=1)
    with pytest.raises(ValueError, match="valid_lengths"):
        layer.prefill(*_qkv(5, device, query=wide), scale=SCALE,
                      valid_lengths=torch.tensor([5, 6], dtype=torch.int32, device=device))  # fmt: skip
    assert layer.num_query_heads is None
    layer.prefill(*_qkv(5, device), scale=SCALE)
    assert layer.num_query_heads == HQ and layer.query_ring.shape[1] == HQ


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_evicting_before_any_query_is_refused_alike_by_both_backends(device, monkeypatch, backend):
    monkeypatch.setenv("VASE_BACKEND", backend)
    layer = VaSECacheLayer(
        VaSEConfig(policy="snapkv", budget=16, window=8, n_sink=2),
        batch_size=B, num_kv_heads=HKV, head_dim=D, dtype=DTYPE, device=device, num_query_heads=HQ,
    )
    snapshot = _snapshot(layer)
    with pytest.raises(ValueError, match="the layer has not seen any query yet"):
        layer.evict()
    _assert_untouched(layer, snapshot)
