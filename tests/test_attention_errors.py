"""Bad arguments to the public attention ops raise errors that name the argument; backend dispatch."""

from __future__ import annotations

import pytest
import torch

import vase_triton.kernels.decode_attention as decode_kernels
import vase_triton.kernels.prefill_attention as prefill_kernels
from vase_triton.ops import decode_attention, prefill_attention


def prefill_args(**overrides):
    gen = torch.Generator().manual_seed(0)
    args = {
        "q": torch.randn(2, 4, 7, 64, generator=gen),
        "k": torch.randn(2, 2, 63, 64, generator=gen),
        "v": torch.randn(2, 2, 63, 64, generator=gen),
        "kv_lens": torch.tensor([63, 5], dtype=torch.int32),
        "score_window": 3,
    }
    args.update(overrides)
    return args


def decode_args(**overrides):
    gen = torch.Generator().manual_seed(1)
    args = {
        "q": torch.randn(2, 4, 1, 64, generator=gen),
        "k_cache": torch.randn(2, 2, 111, 64, generator=gen),
        "v_cache": torch.randn(2, 2, 111, 64, generator=gen),
        "cache_lens": torch.tensor([111, 1], dtype=torch.int32),
        "scores": torch.zeros(2, 2, 111),
    }
    args.update(overrides)
    return args


def call_prefill(args):
    args = dict(args)
    return prefill_attention(args.pop("q"), args.pop("k"), args.pop("v"), **args)


def call_decode(args):
    args = dict(args)
    return decode_attention(args.pop("q"), args.pop("k_cache"), args.pop("v_cache"), args.pop("cache_lens"), **args)


PREFILL_ERRORS = {
    "q-rank3": ({"q": torch.randn(4, 7, 64)}, ValueError, "q"),
    "k-rank5": ({"k": torch.randn(2, 2, 63, 64, 1)}, ValueError, "k"),
    "v-rank3": ({"v": torch.randn(2, 63, 64)}, ValueError, "v"),
    "q-int-dtype": ({"q": torch.ones(2, 4, 7, 64, dtype=torch.int32)}, TypeError, "q"),
    "q-fp64": ({"q": torch.randn(2, 4, 7, 64, dtype=torch.float64)}, TypeError, "q"),
    "k-mixed-dtype": ({"k": torch.randn(2, 2, 63, 64, dtype=torch.float16)}, TypeError, "k"),
    "k-meta-device": ({"k": torch.empty(2, 2, 63, 64, device="meta")}, ValueError, "k"),
    "kv_lens-meta-device": ({"kv_lens": torch.empty(2, dtype=torch.int32, device="meta")}, ValueError, "kv_lens"),
    "k-batch": ({"k": torch.randn(3, 2, 63, 64), "v": torch.randn(3, 2, 63, 64)}, ValueError, "k"),
    "k-head-dim": ({"k": torch.randn(2, 2, 63, 32), "v": torch.randn(2, 2, 63, 32)}, ValueError, "k"),
    "v-shape": ({"v": torch.randn(2, 2, 62, 64)}, ValueError, "v"),
    "k-heads-not-dividing": ({"k": torch.randn(2, 3, 63, 64), "v": torch.randn(2, 3, 63, 64)}, ValueError, "k"),
    "q-head-dim-48": (
        {"q": torch.randn(2, 4, 7, 48), "k": torch.randn(2, 2, 63, 48), "v": torch.randn(2, 2, 63, 48)},
        ValueError,
        "q",
    ),
    "q-longer-than-k": ({"q": torch.randn(2, 4, 64, 64)}, ValueError, "q"),
    "q-no-heads": ({"q": torch.randn(2, 0, 7, 64)}, ValueError, "q"),
    "causal-int": ({"causal": 1}, TypeError, "causal"),
    "score_window-float": ({"score_window": 2.0}, TypeError, "score_window"),
    "score_window-over-Tq": ({"score_window": 8}, ValueError, "score_window"),
    "score_window-negative": ({"score_window": -1}, ValueError, "score_window"),
    "kv_lens-over-Tk": ({"kv_lens": torch.tensor([64, 5], dtype=torch.int32)}, ValueError, "kv_lens"),
    "kv_lens-negative": ({"kv_lens": torch.tensor([-1, 5], dtype=torch.int32)}, ValueError, "kv_lens"),
    "kv_lens-shape": ({"kv_lens": torch.tensor([63, 5, 5], dtype=torch.int32)}, ValueError, "kv_lens"),
    "kv_lens-rank2": ({"kv_lens": torch.tensor([[63, 5]], dtype=torch.int32)}, ValueError, "kv_lens"),
    "kv_lens-not-tensor": ({"kv_lens": [63, 5]}, TypeError, "kv_lens"),
    "kv_lens-float": ({"kv_lens": torch.tensor([63.0, 5.0])}, TypeError, "kv_lens"),
    "scale-zero": ({"scale": 0.0}, ValueError, "scale"),
    "scale-nan": ({"scale": float("nan")}, ValueError, "scale"),
    "scale-str": ({"scale": "0.1"}, ValueError, "scale"),
}

DECODE_ERRORS = {
    "q-rank3": ({"q": torch.randn(2, 4, 64)}, ValueError, "q"),
    "k_cache-rank3": ({"k_cache": torch.randn(2, 111, 64)}, ValueError, "k_cache"),
    "v_cache-rank5": ({"v_cache": torch.randn(2, 2, 111, 64, 1)}, ValueError, "v_cache"),
    "q-int-dtype": ({"q": torch.ones(2, 4, 1, 64, dtype=torch.int64)}, TypeError, "q"),
    "v_cache-mixed-dtype": ({"v_cache": torch.randn(2, 2, 111, 64, dtype=torch.bfloat16)}, TypeError, "v_cache"),
    "cache_lens-not-tensor": ({"cache_lens": [111, 1]}, TypeError, "cache_lens"),
    "k_cache-meta-device": ({"k_cache": torch.empty(2, 2, 111, 64, device="meta")}, ValueError, "k_cache"),
    "scores-meta-device": ({"scores": torch.empty(2, 2, 111, device="meta")}, ValueError, "scores"),
    "q-two-queries": ({"q": torch.randn(2, 4, 2, 64)}, ValueError, "q"),
    "q-no-heads": ({"q": torch.randn(2, 0, 1, 64)}, ValueError, "q"),
    "k_cache-batch": (
        {"k_cache": torch.randn(3, 2, 111, 64), "v_cache": torch.randn(3, 2, 111, 64)},
        ValueError,
        "k_cache",
    ),
    "v_cache-shape": ({"v_cache": torch.randn(2, 2, 110, 64)}, ValueError, "v_cache"),
    "k_cache-heads-not-dividing": (
        {"k_cache": torch.randn(2, 3, 111, 64), "v_cache": torch.randn(2, 3, 111, 64)},
        ValueError,
        "k_cache",
    ),
    "q-head-dim-96": (
        {"q": torch.randn(2, 4, 1, 96), "k_cache": torch.randn(2, 2, 111, 96), "v_cache": torch.randn(2, 2, 111, 96)},
        ValueError,
        "q",
    ),
    "cache_lens-over-C": ({"cache_lens": torch.tensor([112, 1], dtype=torch.int32)}, ValueError, "cache_lens"),
    "cache_lens-negative": ({"cache_lens": torch.tensor([111, -1], dtype=torch.int32)}, ValueError, "cache_lens"),
    "cache_lens-shape": ({"cache_lens": torch.tensor([111], dtype=torch.int32)}, ValueError, "cache_lens"),
    "cache_lens-float": ({"cache_lens": torch.tensor([111.0, 1.0])}, TypeError, "cache_lens"),
    "scores-not-tensor": ({"scores": [0.0]}, TypeError, "scores"),
    "scores-shape": ({"scores": torch.zeros(2, 2, 110)}, ValueError, "scores"),
    "scores-dtype": ({"scores": torch.zeros(2, 2, 111, dtype=torch.float64)}, TypeError, "scores"),
    "scores-non-contiguous": ({"scores": torch.zeros(2, 111, 2).transpose(1, 2)}, ValueError, "scores"),
    "scale-negative": ({"scale": -0.1}, ValueError, "scale"),
}


@pytest.mark.parametrize("overrides, error, name", PREFILL_ERRORS.values(), ids=PREFILL_ERRORS.keys())
def test_prefill_rejects(overrides, error, name):
    with pytest.raises(error, match=rf"^{name}: expected"):
        call_prefill(prefill_args(**overrides))


@pytest.mark.parametrize("overrides, error, name", DECODE_ERRORS.values(), ids=DECODE_ERRORS.keys())
def test_decode_rejects(overrides, error, name):
    with pytest.raises(error, match=rf"^{name}: expected"):
        call_decode(decode_args(**overrides))


@pytest.fixture
def launcher_calls(monkeypatch):
    """Counts calls of the Triton launchers that the custom ops import at call time."""
    calls = []

    def counting(launcher):
        def wrapped(*args, **kwargs):
            calls.append(launcher.__name__)
            return launcher(*args, **kwargs)

        return wrapped

    monkeypatch.setattr(prefill_kernels, "prefill_attention_triton", counting(prefill_kernels.prefill_attention_triton))
    monkeypatch.setattr(decode_kernels, "decode_attention_triton", counting(decode_kernels.decode_attention_triton))
    return calls


def on_device(args, device):
    return {key: value.to(device) if isinstance(value, torch.Tensor) else value for key, value in args.items()}


def run_both(device):
    args_decode = on_device(decode_args(), device)
    out, lse, scores = call_prefill(on_device(prefill_args(), device))
    step = call_decode(args_decode)
    return out, lse, scores, step, args_decode["scores"]


def test_torch_and_triton_backends_agree(monkeypatch, launcher_calls, device):
    monkeypatch.setenv("VASE_BACKEND", "torch")
    expected = run_both(device)
    assert launcher_calls == []
    monkeypatch.setenv("VASE_BACKEND", "triton")
    actual = run_both(device)
    assert launcher_calls == ["prefill_attention_triton", "decode_attention_triton"]
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-5)


def test_bad_backend_value_raises(monkeypatch):
    monkeypatch.setenv("VASE_BACKEND", "cuda")
    with pytest.raises(ValueError, match=r"^VASE_BACKEND: expected"):
        call_prefill(prefill_args())
    with pytest.raises(ValueError, match=r"^VASE_BACKEND: expected"):
        call_decode(decode_args())


@pytest.mark.parametrize("value, interpreted", [("1", True), ("true", True), ("On", True),
                                                ("0", False), ("false", False), ("off", False), ("2", False)])
def test_triton_interpret_is_read_as_triton_reads_it(monkeypatch, value, interpreted):
    """A value Triton reads as off sends CPU tensors to the reference under `auto`, not to a
    Triton without its interpreter (and without a GPU driver)."""
    from vase_triton.backend import interpreter_enabled, use_triton

    monkeypatch.setenv("TRITON_INTERPRET", value)
    monkeypatch.delenv("VASE_BACKEND", raising=False)
    assert interpreter_enabled() is interpreted
    assert use_triton(torch.device("cpu")) is interpreted
