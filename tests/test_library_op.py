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
from vase_triton.cache_tensors import CacheTensors
from vase_triton.ops import attention as ops_attention
from vase_triton.ops import cache_append as ops_cache_append
from vase_triton.ops import eviction as ops_eviction
from vase_triton.ops.attention import decode_attention_op
from vase_triton.ops.candidate_pool import pooled_candidates
from vase_triton.ops.device_guard import on_tensors_device
from vase_triton.ops.gaussian import standard_normal_
from vase_triton.ops.key_similarity import mean_key_similarity
from vase_triton.ops.library_op import LibraryOp
from vase_triton.ops.projected_energy import projected_energy


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

    @property
    def is_cuda(self) -> bool:
        return True


def test_a_call_runs_with_its_tensors_gpu_current(fake_cuda_devices):
    """Triton launches on the current GPU: a call on cuda:1 while cuda:0 is current must switch to cuda:1."""
    seen_current = []
    run = on_tensors_device(lambda *args, scale=1.0: seen_current.append(fake_cuda_devices.current) or scale)
    on_second = torch.Tensor._make_subclass(_ReportsSecondGPU, torch.zeros(1))
    assert run(3, on_second, scale=2.0) == 2.0
    assert seen_current == [1] and fake_cuda_devices.switched_to == [1] and fake_cuda_devices.current == 0
    fake_cuda_devices.current = 1  # already current: no switch
    run(on_second)
    assert seen_current == [1, 1] and fake_cuda_devices.switched_to == [1]
    run(torch.zeros(1), 0.5)  # CPU tensors: nothing to switch
    assert seen_current == [1, 1, 1] and fake_cuda_devices.switched_to == [1]


def _library_ops() -> list[LibraryOp]:
    modules = (ops_attention, ops_cache_append, ops_eviction)
    return [value for module in modules for value in vars(module).values() if isinstance(value, LibraryOp)]


def test_every_op_launches_on_its_tensors_gpu():
    """The registered ops, eagerly and as the dispatcher's CUDA kernel, and the plain ops of the
    eviction's importance all run under `on_tensors_device`."""
    guarded_code = on_tensors_device(print).__code__
    registered = _library_ops()
    assert {op.name for op in registered} == {
        "vase_triton::prefill_attention", "vase_triton::decode_attention", "vase_triton::candidate_attention",
        "vase_triton::append_", "vase_triton::evict_",
    }  # fmt: skip
    for op in registered:
        assert op.function.__code__ is guarded_code, op.name
        assert torch._C._dispatch_has_kernel_for_dispatch_key(op.name, "CUDA"), op.name
    for plain in (pooled_candidates, mean_key_similarity, standard_normal_, projected_energy):
        assert plain.__code__ is guarded_code and plain.__wrapped__ is not None, plain.__name__


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


@pytest.mark.gpu
@pytest.mark.parametrize("policy", ["vase", "rkv", "vase-dkv"])
def test_a_cache_on_a_second_gpu_evicts_the_same_whichever_gpu_is_current(policy):
    """A prompt compressed at prefill (importance, selection, compaction) by a layer on cuda:1
    leaves the same buffers, to the bit, with cuda:0 or cuda:1 current."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA devices")
    from vase_triton.cache import VaSECacheLayer
    from vase_triton.config import VaSEConfig

    second = torch.device("cuda", 1)
    generator = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(2, heads, 111, 64, generator=generator).to(second) for heads in (4, 2, 2))
    config = VaSEConfig(policy=policy, budget=48, window=16)
    buffers = []
    for current in (1, 0):
        layer = VaSECacheLayer(config, batch_size=2, num_kv_heads=2, head_dim=64, dtype=torch.float32, device=second)
        with torch.cuda.device(current):
            layer.prefill(q, k, v, scale=0.125)
            torch.cuda.synchronize(second)
        assert layer.n_evictions == 1
        buffers.append([tensor.cpu() for tensor in layer.tensors])
    for name, on_second, on_first in zip(CacheTensors._fields, *buffers):
        assert torch.equal(on_second, on_first), name


def _op_calls(device: torch.device) -> dict[str, tuple]:
    """Each registered op (but the eviction, which `test_eviction_kernel` checks) and arguments
    that reach its interesting paths: GQA, ragged lengths, scores emitted, a split-K workspace."""
    gen = torch.Generator().manual_seed(5)

    def randn(*shape):
        return torch.randn(*shape, generator=gen).to(device)

    q, k, v = randn(2, 4, 11, 32), randn(2, 2, 11, 32), randn(2, 2, 11, 32)
    lens = torch.tensor([11, 5], dtype=torch.int32, device=device)
    k_cache, v_cache = randn(2, 2, 63, 32), randn(2, 2, 63, 32)
    cache_lens = torch.tensor([63, 9], dtype=torch.int32, device=device)
    workspace = ops_attention.decode_workspace(4, k_cache, torch.float32, emit_scores=True)
    cache = CacheTensors.empty(2, 2, 16, 32, dtype=torch.float32, device=device)
    cache.lengths.copy_(torch.tensor([3, 14], dtype=torch.int32))
    return {
        "prefill_attention": (ops_attention._prefill_attention_op.op, (q, k, v, lens, 0.17, True, 4)),
        "decode_attention": (decode_attention_op.op, (randn(2, 4, 1, 32), k_cache, v_cache, cache_lens, 0.17,
                                                      torch.zeros(2, 2, 63, device=device), *workspace)),
        "candidate_attention": (ops_attention.candidate_attention_op.op,
                                (randn(2, 4, 3, 32), k_cache, cache_lens,
                                 torch.tensor([[True, True, False], [True, True, True]], device=device), 0.17)),
        "append_": (ops_cache_append.append_op.op, (*cache, randn(2, 2, 2, 32), randn(2, 2, 2, 32), "range")),
    }  # fmt: skip


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("name", ["prefill_attention", "decode_attention", "candidate_attention", "append_"])
def test_registered_ops_declare_what_they_mutate_and_fake_what_they_return(device, monkeypatch, backend, name):
    """torch.library's own checks: no input is mutated unless the schema says so (torch.compile
    relies on it), and the fake implementation returns what the op does (shapes, dtypes, strides)."""
    monkeypatch.setenv("VASE_BACKEND", backend)
    op, args = _op_calls(device)[name]
    torch.library.opcheck(op, args, test_utils=("test_schema", "test_faketensor"))
