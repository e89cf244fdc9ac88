"""Every checkpoint the library loads keeps transformers' stock modules (no Hub kernels)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture
def kernel_requests(monkeypatch):
    """The `use_kernels` value `from_pretrained` passes to each model it builds, in order."""
    from transformers import PreTrainedModel

    requests: list = []
    original = PreTrainedModel.set_use_kernels

    def recording(self, use_kernels, *args, **kwargs):
        requests.append(use_kernels)
        return original(self, use_kernels, *args, **kwargs)

    monkeypatch.setattr(PreTrainedModel, "set_use_kernels", recording)
    return requests


def test_library_loads_ask_for_no_hub_kernels(saved_model_dir, kernel_requests):
    from vase_triton.commands.common import load_model
    from vase_triton.integrations.loading import load_causal_lm
    from vase_triton.testbed.model import load_testbed

    loaded = load_causal_lm(saved_model_dir, dtype=torch.bfloat16)
    load_model(str(saved_model_dir), torch.device("cpu"), torch.float32)
    load_testbed()
    assert kernel_requests == [False, False, False]
    assert not loaded.use_kernels and loaded.dtype == torch.bfloat16
