#!/usr/bin/env bash
# One short GPU session: the kernel tests on CUDA (compiled kernels vs the float64
# reference), then the benchmarks at the key shapes, with their report.
#
#   bash benchmarks/gpu_check.sh [OUT_DIR]     # OUT_DIR defaults to $OUT, else benchmarks/results
#
# Needs torch, triton, transformers, pytest and pytest-benchmark
# installed; the repository is used in place (no install, no network).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-${OUT:-benchmarks/results}}"
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

{
  date -u +"date: %Y-%m-%dT%H:%M:%SZ"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import sys, torch, triton, transformers; print('python', sys.version.split()[0], '| torch', torch.__version__, '| triton', triton.__version__, '| transformers', transformers.__version__)"
} | tee "$out/gpu_environment.txt"

status=0
timeout 300 python3 -m pytest -q -x \
  tests/test_prefill_attention.py tests/test_decode_attention.py tests/test_attention_compile.py \
  tests/test_cache_append.py tests/test_eviction_kernel.py tests/test_sampling.py \
  tests/test_cache_layer.py tests/test_cache_static_memory.py tests/test_integration_qwen3.py \
  2>&1 | tee "$out/gpu_tests.log" || status=1

timeout 240 python3 -m pytest -q benchmarks 2>&1 | tee "$out/gpu_benchmarks.log" || status=1
find benchmarks/results -name '*.md' -newer "$out/gpu_environment.txt" -exec cp {} "$out/" \; 2>/dev/null
exit "$status"
