#!/usr/bin/env bash
# One short GPU session on one H100/H200 with the packages preinstalled and no network:
# the CUDA tests (compiled kernels against the float64 reference), then the headline
# benchmarks, their pytest-benchmark JSON, the markdown report and the plots, all in OUT_DIR.
#
#   bash benchmarks/gpu_check.sh [OUT_DIR]    # default: $OUT, else benchmarks/results/<gpu>-<date>
#   VASE_BENCH_COMMIT=<commit> bash benchmarks/gpu_check.sh OUT_DIR    # a copy without .git
#   VASE_GPU_CHECK_STEPS="attention eviction prompt paper" VASE_GPU_CHECK_SECONDS=540 bash benchmarks/gpu_check.sh OUT_DIR
#
# VASE_GPU_CHECK_STEPS: the steps to run, by name (default: all but `profile`, `prompt` and
# `paper`): tests autotune attention eviction profile prompt end_to_end paper. `paper` is the
# paper protocol's estimate (bench_paper_throughput.py, `gpu` profile, minutes of Qwen3-14B
# prefills and decoding), `prompt` a prompt to its first token (bench_prompt.py, 8k and 32k
# tokens) and `profile` the decode step profile of the end-to-end methods: they do not
# fit beside the others, so a second call runs them, with what else it wants.
# VASE_GPU_CHECK_SECONDS: the deadline of the steps before the report (default 420). The
# `end_to_end` and `paper` steps each take the time left before it, so a run names one of them.
#
# Time budget (seconds; the whole script stays under 8 minutes):
#   environment                        ~5   (each command under a timeout, as is `autotune --show`)
#   CUDA tests                         160  (limit; 8 processes: ~130 s for 424 tests on an H200, 16 were no
#                                           faster; 501 now, the reference's CPU-only tests left to CI)
#   autotuning                          60  (limit) Qwen3-8B decode-time kernels, batch 16, budget 4096:
#                                           the default-vs-tuned table and the stored file
#   attention benchmarks                75  (limit) prefill + decode (last, decode at forced split counts);
#                                           roofline measured in the session
#   eviction benchmarks                 60  (limit) eviction per policy, a vase eviction's two parts,
#                                           emitted-mode eviction, score modes
#   decode step profile                 90  (limit; only when named) host against device time of each
#                                           end-to-end method's decode step (vase-2048, then hf-dynamic,
#                                           ...), and its top kernels
#   prompt to first token               60  (limit; only when named) DynamicCache and VaSE-2048,
#                                           Qwen3-8B layout at 4 layers, 8k and 32k tokens
#   end-to-end decoding                ~30+ what is left of the first 420 s (VASE_GPU_CHECK_SECONDS), shared by its four
#                                           methods as they go (VASE_BENCH_DECODE_DEADLINE), less
#                                           their compilation and warm-up (30 s compiled, 5 s eager)
#   report                              20  (limit)
#   worst case              420 + 10 + 15 + 20 + 10 = 475: the step cut at the deadline and the
#                                           report may each take the 10 s interrupt grace (a step cut
#                                           at its own limit takes it from the steps after it), and
#                                           `autotune --show` its 15 s timeout outside the deadline
#   (with VASE_GPU_CHECK_SECONDS=S: S + 55 at most, whatever the steps; keep that under the
#   caller's own limit)
#
# Each step runs under `timeout -s INT`: pytest, interrupted, still writes the JSON of the
# rows it finished. A step that fails or is cut short does not stop the next; the exit
# status is 1 when any step failed. Needs torch, triton, transformers, pytest and
# pytest-benchmark (matplotlib for the plots); the repository is used in place (no install).
# `VASE_BENCH_PROFILE=smoke` runs the same steps on a CPU machine: a dry run of this script.
set -uo pipefail
default_steps="tests autotune attention eviction end_to_end"
known_steps="$default_steps profile prompt paper"
steps="${VASE_GPU_CHECK_STEPS:-$default_steps}"
# wanted NAME: whether VASE_GPU_CHECK_STEPS names the step.
wanted() { [[ " $steps " == *" $1 "* ]]; }
for step in $steps; do
  if [[ " $known_steps " != *" $step "* ]]; then
    echo "VASE_GPU_CHECK_STEPS: expected names among $known_steps; got '$step'" >&2
    exit 2
  fi
done
if wanted end_to_end && wanted paper; then
  echo "VASE_GPU_CHECK_STEPS: end_to_end and paper each take the time left; name one of them" >&2
  exit 2
fi
seconds="${VASE_GPU_CHECK_SECONDS:-420}"
if ! [[ "$seconds" =~ ^[0-9]+$ ]] || ((seconds < 60)); then
  echo "VASE_GPU_CHECK_SECONDS: expected a whole number of seconds >= 60; got '$seconds'" >&2
  exit 2
fi
out_arg="${1:-${OUT:-}}"
if [[ -n "$out_arg" && "$out_arg" != /* ]]; then out_arg="$PWD/$out_arg"; fi  # relative to where it was called
cd "$(dirname "$0")/.."
unset VASE_BACKEND  # the vase rows run the Triton kernels, whatever the calling shell asked for
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 VASE_BENCH_PROFILE=${VASE_BENCH_PROFILE:-gpu}
python=${PYTHON:-python3}
start=$(date +%s)
deadline=$((start + seconds))
grace=10

gpu=$(timeout 20 nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n1 | tr 'A-Z' 'a-z' | tr -cs 'a-z0-9' '-' | sed 's/-$//')
out="${out_arg:-benchmarks/results/${gpu:-gpu}-$(date -u +%Y-%m-%d)}"
mkdir -p "$out"
status=0

# run_step NAME LIMIT_SECONDS COMMAND...: at most LIMIT seconds and never past the deadline.
run_step() {
  local name=$1 limit=$2
  shift 2
  [[ $name == report ]] || wanted "$name" || return 0
  local left=$((deadline - $(date +%s)))
  ((limit > left)) && limit=$left
  if ((limit < 10)); then
    echo "== $name: skipped, no time left" | tee -a "$out/steps.txt"
    status=1
    return
  fi
  echo "== $name (limit ${limit}s)"
  local began=$(date +%s)
  timeout -s INT -k "$grace" "$limit" "$@" > "$out/$name.log" 2>&1
  local rc=$?
  echo "== $name: exit $rc after $(($(date +%s) - began))s" | tee -a "$out/steps.txt"
  tail -n 5 "$out/$name.log"
  ((rc != 0)) && status=1
}

{
  date -u +"date: %Y-%m-%dT%H:%M:%SZ"
  echo "commit: ${VASE_BENCH_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}"
  timeout 20 nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv,noheader
  timeout 60 $python -c "import sys, torch, triton, transformers; print('python', sys.version.split()[0], '| torch', torch.__version__, '| triton', triton.__version__, '| transformers', transformers.__version__)"
  # The baselines' SDPA picks among these; a cuDNN SDPA plan is built per new key length.
  timeout 60 $python -c "import torch; from benchmarks.environment import sdpa_backends; print('cudnn', torch.backends.cudnn.version(), '| SDPA backends enabled:', *sdpa_backends())"
} > "$out/environment.txt" 2>&1
cat "$out/environment.txt"

# The GPU's host has many cores: the tests (and their Triton and inductor compilations) run in
# 8 processes sharing the GPU, by pytest-xdist when installed, else by benchmarks.parallel_tests
# (one log per process under OUT_DIR/tests). One process would need about 5 minutes. The
# `test_reference_*` tests check the PyTorch reference on CPU tensors: CI runs them.
cuda_only='not test_reference_'
cuda_tests=(
  tests/test_prefill_attention.py tests/test_decode_attention.py tests/test_candidate_attention.py
  tests/test_attention_compile.py tests/test_cache_append.py tests/test_eviction_kernel.py tests/test_sampling.py
  tests/test_gaussian.py tests/test_projected_energy.py tests/test_key_similarity.py tests/test_candidate_pool.py
  tests/test_cache_layer.py
  tests/test_observation_window.py tests/test_cache_static_memory.py tests/test_integration_qwen3.py
  tests/test_call_paths.py tests/test_autotune_lookup.py tests/test_eviction_graph.py tests/test_library_op.py
)
if $python -c "import xdist" 2>/dev/null; then
  run_step tests 160 $python -m pytest -q -p no:cacheprovider -rfEs --durations=15 -n 8 -k "$cuda_only" \
    "${cuda_tests[@]}"
else
  run_step tests 160 $python -m benchmarks.parallel_tests --jobs 8 --log-dir "$out/tests" -k "$cuda_only" \
    "${cuda_tests[@]}"
fi

# Autotuning into OUT_DIR (the benchmarks below keep the launchers' heuristics): the
# command's table compares the default and the tuned configuration of each key.
if wanted autotune; then
  printf '%s\n' '{"model_type": "qwen3", "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "hidden_size": 4096}' \
    > "$out/qwen3_8b_config.json"
  run_step autotune 60 env VASE_AUTOTUNE_DIR="$out/autotune" $python -m vase_triton autotune \
    --config "$out/qwen3_8b_config.json" --batch 16 --budget 4096 --prompt-len 1024 --dtype bfloat16 \
    --kernels decode,decode_combine,append,evict_select,evict_compact --time-limit 45
  VASE_AUTOTUNE_DIR="$out/autotune" timeout 15 $python -m vase_triton autotune --show > "$out/autotune_stored.txt" 2>&1
fi

run_step attention 75 $python -m pytest -q -p no:cacheprovider \
  benchmarks/bench_prefill.py benchmarks/bench_decode.py --benchmark-json "$out/attention.json"

run_step eviction 60 $python -m pytest -q -p no:cacheprovider \
  benchmarks/bench_eviction.py benchmarks/bench_score_modes.py --benchmark-json "$out/eviction.json"

# Inductor's performance hints and dynamo's recompilations go into the logs of the two
# decoding steps: a decode step that skipped CUDA graphs or recompiled shows there. The 64
# profiled steps of a VaSE cache, full from its prompt, hold one eviction (one a window), so
# its per-step device time includes an eviction's share as in steady decoding.
run_step profile 90 env TORCH_LOGS="perf_hints,recompiles" \
  $python -m benchmarks.profile_decode --steps 64 --warmup 8 --out "$out"

run_step prompt 60 $python -m pytest -q -s -p no:cacheprovider \
  benchmarks/bench_prompt.py --benchmark-json "$out/prompt.json"

# End to end: the four methods share the time left (VaSE first): each decodes for its
# share of what is left when it starts, once the compilation and warm-up of it and the
# methods after it are set aside, so time a fast method does not need goes to the next;
# 10 s stay for the interrupt grace.
left=$((deadline - $(date +%s)))
run_step end_to_end "$left" env TORCH_LOGS="perf_hints,recompiles" VASE_BENCH_DECODE_DEADLINE=$((deadline - grace)) \
  $python -m pytest -q -s -p no:cacheprovider benchmarks/bench_end_to_end.py --benchmark-json "$out/end_to_end.json"

# The paper protocol's estimate, when asked for: its three methods in turn (the full cache
# last), with the time left; a method cut short leaves the rows of those before it.
left=$((deadline - $(date +%s)))
run_step paper "$left" $python -m pytest -q -s -p no:cacheprovider \
  benchmarks/bench_paper_throughput.py --benchmark-json "$out/paper.json"

deadline=$(($(date +%s) + 20))
results=()
benchmarks_named=0
for name in attention eviction prompt end_to_end paper; do
  wanted "$name" && benchmarks_named=1
  [[ -f "$out/$name.json" ]] && results+=("$out/$name.json")
done
if ((${#results[@]})); then
  run_step report 20 $python -m benchmarks.report "${results[@]}" --out "$out"
elif ((benchmarks_named)); then
  echo "== report: no benchmark JSON was written" | tee -a "$out/steps.txt"
  status=1
else
  echo "== report: no benchmark step was named" | tee -a "$out/steps.txt"
fi
echo "total: $(($(date +%s) - start))s; results in $out"
exit "$status"
