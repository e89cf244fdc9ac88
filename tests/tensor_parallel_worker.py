"""One rank of the tensor-parallel check (run by `torch.distributed.run`, gloo on CPU).

Loads a saved model with transformers' tensor-parallel plan, generates greedily unpatched
and patched (policy `full`, then `vase`), and prints one JSON line per rank: the tokens,
and the KV heads the rank's cache holds (how many, and the model's index of the first).
"""

import json
import os
import sys

import torch

import vase_triton
from vase_triton import VaSECache, VaSEConfig
from vase_triton.integrations.loading import load_causal_lm


def load(path: str):
    try:
        from transformers.distributed import DistributedConfig
    except ImportError:
        return load_causal_lm(path, tp_plan="auto", dtype=torch.float32)
    return load_causal_lm(
        path, distributed_config=DistributedConfig(tp_plan="auto"), dtype=torch.float32
    )


def main() -> None:
    os.environ["VASE_BACKEND"] = "torch"
    model = load(sys.argv[1]).eval()
    input_ids = torch.tensor([[1, 40, 41, 42, 43, 44, 45, 46, 47]])
    kwargs = dict(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=30, do_sample=False)
    with torch.no_grad():
        unpatched = model.generate(**kwargs)
        full = VaSEConfig(policy="full", budget=64, window=8)
        vase_triton.patch_qwen3(model, full)
        patched_full = model.generate(**kwargs)
        evicting = VaSEConfig(budget=16, window=4)
        vase_triton.patch_qwen3(model, evicting)
        cache = VaSECache.for_model(model, evicting, batch_size=1)
        patched_vase = model.generate(**kwargs, cache=cache)
    # One write per rank: the two ranks share stdout, and a separate newline could interleave.
    sys.stdout.write(json.dumps({
        "rank": int(os.environ["RANK"]),
        "unpatched": unpatched[0].tolist(),
        "full": patched_full[0].tolist(),
        "vase": patched_vase[0].tolist(),
        "kv_heads": cache.stores[0].num_kv_heads,
        "kv_head_offset": cache.stores[0].kv_head_offset,
        "evictions": cache.n_evictions,
    }) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
