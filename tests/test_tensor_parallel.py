"""Tensor parallelism: two ranks (gloo, CPU) each hold half the KV heads; VaSE runs on each without communication.

transformers' `tp_plan="auto"` shards the attention projections by head; the cache of
each rank sizes itself from the heads its projections produce. Policy `full` must
generate exactly what the unpatched sharded model does, and `vase` must evict on both
ranks in lockstep (same tokens on both: the sharded model's outputs are all-reduced).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vase_triton.demo_model import tiny_qwen3


def test_two_ranks_each_cache_their_own_heads(tmp_path):
    pytest.importorskip("torch.distributed.tensor")
    model = tiny_qwen3(seed=1)
    # An even vocabulary (one unused id more): transformers 5.17 splits lm_head's outputs over the ranks.
    model.resize_token_embeddings(model.config.vocab_size + 1)
    model.save_pretrained(tmp_path)
    worker = Path(__file__).with_name("tensor_parallel_worker.py")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TRITON_INTERPRET": "0"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               str(worker), str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert sorted(rank["rank"] for rank in ranks) == [0, 1]
    for rank in ranks:
        assert rank["kv_heads"] == 1  # the tiny model has 2 KV heads: one per rank
        assert rank["kv_head_offset"] == rank["rank"]  # which keys the rank's eviction draws
        assert rank["full"] == rank["unpatched"]
        assert rank["evictions"] >= 5
    assert ranks[0]["vase"] == ranks[1]["vase"]
