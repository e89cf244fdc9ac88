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


class _ReportsSecondGPU(torch.Tensor):
    """A CPU tensor that says it is on cuda:1 (the device a call must make current)."""

    @property
    def device(self) -> torch.device:
        return torch.device("cuda", 1)


def test_a_call_runs_with_its_tensors_gpu_current(monkeypatch):
    """Triton launches on the current GPU: a call on cuda:1 while cuda:0 is current must switch to cuda:1."""
    from vase_triton.ops.library_op import on_tensors_device

    current = [0]
    switched_to = []

    class DeviceGuard:
        def __init__(self, device):
            self.index = torch.device(device).index

        def __enter__(self):
            switched_to.append(self.index)
            self.previous, current[0] = current[0], self.index

        def __exit__(self, *exc):
            current[0] = self.previous

    monkeypatch.setattr(torch.cuda, "current_device", lambda: current[0])
    monkeypatch.setattr(torch.cuda, "device", DeviceGuard)
    seen_current = []
    run = on_tensors_device(lambda *args, scale=1.0: seen_current.append(current[0]) or scale)
    on_second = torch.Tensor._make_subclass(_ReportsSecondGPU, torch.zeros(1))
    assert run(3, on_second, scale=2.0) == 2.0
    assert seen_current == [1] and switched_to == [1] and current == [0]
    current[0] = 1  # already current: no switch
    run(on_second)
    assert seen_current == [1, 1] and switched_to == [1]
    run(torch.zeros(1), 0.5)  # CPU tensors: nothing to switch
    assert seen_current == [1, 1, 1] and switched_to == [1]


@pytest.mark.gpu
def test_an_op_on_a_second_gpu_runs_there_while_the_first_is_current():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA devices")
    second = torch.device("cuda", 1)
    with torch.cuda.device(0):
        q, k, v, lens = inputs(second)
        scores = torch.zeros(2, 2, 63, device=second)
        out = decode_attention_op(q, k, v, lens, 0.125, scores, None, None, None)
        through_dispatcher = decode_attention_op.op(q, k, v, lens, 0.125, None, None, None, None)
    expected = reference.decode_attention(q.double(), k.double(), v.double(), lens, scale=0.125)
    torch.testing.assert_close(out.double(), expected, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(through_dispatcher.double(), expected, rtol=1e-4, atol=1e-5)
