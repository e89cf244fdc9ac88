"""Registered ops: a plain eager call runs the op's function without the dispatcher; tracing,
fake tensors, dispatch modes, tensor subclasses and inputs that need gradients go through
the registered op (`vase_triton.ops.library_op`)."""

from __future__ import annotations

import math

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

from vase_triton import reference
from vase_triton.ops.attention import decode_attention_op


@pytest.fixture
def through_op(monkeypatch) -> list[str]:
    """Names of the calls that reached the registered op of `decode_attention_op`."""
    calls: list[str] = []
    registered = decode_attention_op.op

    def recording(*args):
        calls.append("decode_attention")
        return registered(*args)

    monkeypatch.setattr(decode_attention_op, "op", recording)
    return calls


def inputs(device: torch.device):
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(2, 4, 1, 64, generator=gen)
    k = torch.randn(2, 2, 63, 64, generator=gen)
    v = torch.randn(2, 2, 63, 64, generator=gen)
    lens = torch.tensor([63, 9], dtype=torch.int32)
    return [t.to(device) for t in (q, k, v, lens)]


def test_eager_call_runs_the_function_and_matches_the_reference(device, through_op):
    q, k, v, lens = inputs(device)
    scale = 1 / math.sqrt(64)
    scores = torch.zeros(2, 2, 63, device=device)
    out = decode_attention_op(q, k, v, lens, scale, scores, None, None, None)
    assert through_op == []
    expected_scores = torch.zeros(2, 2, 63, dtype=torch.float64, device=device)
    expected = reference.decode_attention(
        q.double(), k.double(), v.double(), lens, scale=scale, scores=expected_scores
    )
    torch.testing.assert_close(out.double(), expected, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(scores.double(), expected_scores, rtol=1e-4, atol=1e-5)


def test_fake_tensors_reach_the_registered_fake(device, through_op):
    with FakeTensorMode():
        q, k, v, lens = (torch.empty_like(t) for t in inputs(device))
        out = decode_attention_op(q, k, v, lens, 0.125, None, None, None, None)
    assert through_op == ["decode_attention"]
    assert tuple(out.shape) == (2, 4, 1, 64)


def test_dispatch_modes_see_one_op(device, through_op):
    seen: list[str] = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(str(func))
            return func(*args, **(kwargs or {}))

    q, k, v, lens = inputs(device)
    with Record():
        decode_attention_op(q, k, v, lens, 0.125, None, None, None, None)
    assert through_op == ["decode_attention"]
    assert seen == ["vase_triton.decode_attention.default"]


def test_inputs_that_need_gradients_go_through_the_op(device, through_op):
    q, k, v, lens = inputs(device)
    q.requires_grad_(True)
    decode_attention_op(q, k, v, lens, 0.125, None, None, None, None)
    assert through_op == ["decode_attention"]
    with torch.no_grad():
        decode_attention_op(q, k, v, lens, 0.125, None, None, None, None)
    assert through_op == ["decode_attention"]


def test_compiled_calls_trace_the_registered_op(device):
    torch._dynamo.reset()
    q, k, v, lens = inputs(device)

    def step(q, k, v, lens):
        return decode_attention_op(q, k, v, lens, 0.125, None, None, None, None) * 2.0

    graphs = []

    def backend(graph_module, example_inputs):
        graphs.append(graph_module)
        return graph_module.forward

    compiled = torch.compile(step, backend=backend, fullgraph=True)
    torch.testing.assert_close(compiled(q, k, v, lens), step(q, k, v, lens))
    targets = [str(node.target) for node in graphs[0].graph.nodes if node.op == "call_function"]
    assert "vase_triton.decode_attention.default" in targets
