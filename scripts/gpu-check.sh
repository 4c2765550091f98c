#!/usr/bin/env bash
# Every check and benchmark that needs a CUDA GPU, in one run of at most 8 minutes (CI has
# no GPU), every figure written under $OUT (default ./gpu-out):
#   1. tests/workers/engine/test_cuda.py: the engine against transformers on the GPU, seeded
#      sampling, KV restored from host RAM and the NAS bit for bit (fp32 and bf16);
#   2. `kvgate bench engine` on an 8B-sized random Llama in bf16, transformers beside it
#      ($OUT/engine_cuda.{md,json});
#   3. `kvgate bench multiturn --compare --quick` on that model, both workloads, sized to
#      its time limit (no object store on the GPU machine): $OUT/multiturn_cuda.{md,json};
#   4. where SGLang imports: a real SGLang server with our storage backend on a small
#      random-weight Llama plays one conversation, its device cache flushed between the
#      turns, and the second turn's cached tokens must come from our tiers
#      ($OUT/sglang_tiers.json; kvgate/bench/multiturn/tiers_check.py).
#
# --dry-run (or GPU_CHECK_DRY_RUN=1) is what CI runs on a CPU, so that this script cannot
# rot: every step's command line is checked against the commands' real options (each ends
# in --help, which click answers only once every option before it parsed), the CUDA tests
# are collected, the conversation check of step 4 plays on the built-in worker with the
# tiny random model, and, where SGLang imports, SGLang's own parser checks step 4's launch.
#
# Optional inputs, for a machine without package registries: .whl/ (wheels installed into
# /tmp/site) and .gpu/tokenizer (written by `kvgate models export-tokenizer
# smollm2-135m-instruct .gpu/tokenizer`; step 4 needs it). Each step has its own time limit
# (GPU_*_S), so one that hangs still leaves the others' results. GPU_EXTRA names one more
# Python script to run first (a profile, say).
set -uo pipefail
DRY=${GPU_CHECK_DRY_RUN:-0}
[ "${1:-}" = "--dry-run" ] && DRY=1
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/log.txt") 2>&1

if compgen -G ".whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export KVGATE_HOME=${KVGATE_HOME:-/tmp/kvgate-home}
[ -d .gpu/tokenizer ] && export KVGATE_WORKER_TOKENIZER=${KVGATE_WORKER_TOKENIZER:-$PWD/.gpu/tokenizer}
PY=${PYTHON:-python3}
MODEL=${GPU_MODEL:-random:llama-3.1-8b}
FAILED=0

step() {  # step SECONDS NAME COMMAND...
    local limit=$1 name=$2 start=$SECONDS rc
    shift 2
    echo "=== $name (limit ${limit}s)"
    timeout --kill-after=10 "$limit" "$@"
    rc=$?
    echo "=== $name: exit $rc after $((SECONDS - start)) s"
    [ "$rc" -eq 0 ] || FAILED=1
}

ENGINE_ARGS=(-m kvgate bench engine --quick --out "$OUT/engine_cuda.md" --json "$OUT/engine_cuda.json")
# GPU_MULTITURN_ARGS narrows the run further, e.g. "--workload chat"
MULTITURN_ARGS=(-m kvgate bench multiturn --compare --quick --budget-s "${GPU_MULTITURN_S:-170}"
    --configs "${GPU_CONFIGS:-infinite,recompute,host,nas}" --name multiturn_cuda
    --json "$OUT/multiturn_cuda.json" ${GPU_MULTITURN_ARGS:-})
SGLANG_CHECK=(-m kvgate.bench.multiturn.tiers_check --engine sglang --json "$OUT/sglang_tiers.json")
HAS_SGLANG=0
$PY -c 'import sglang.srt.server_args' 2> /dev/null && HAS_SGLANG=1

if [ "$DRY" = 1 ]; then
    echo "dry run: command lines checked, the conversation check on the CPU"
    export KVGATE_WORKER_MODEL=${KVGATE_WORKER_MODEL:-tiny-random}
    step 60 "collect cuda tests" $PY -m pytest -q --collect-only -p no:cacheprovider -o addopts= \
        tests/workers/engine/test_cuda.py
    step 60 "bench engine (options)" $PY "${ENGINE_ARGS[@]}" --help
    step 60 "bench multiturn (options)" $PY "${MULTITURN_ARGS[@]}" --help
    step 120 "tiers check (built-in worker)" $PY -m kvgate.bench.multiturn.tiers_check \
        --engine builtin --json "$OUT/builtin_tiers.json"
    if [ "$HAS_SGLANG" = 1 ] && [ -n "${KVGATE_WORKER_TOKENIZER:-}" ]; then
        step 120 "SGLang accepts the launch" $PY "${SGLANG_CHECK[@]}" --parse-only
    else
        echo "=== SGLang launch not checked: SGLang does not import or no tokenizer given"
    fi
    exit $FAILED
fi

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
$PY -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'
[ -n "${GPU_EXTRA:-}" ] && step "${GPU_EXTRA_S:-60}" "$GPU_EXTRA" $PY "$GPU_EXTRA"
step "${GPU_TEST_S:-60}" tests $PY -m pytest -q -p no:cacheprovider -o addopts= \
    --junitxml="$OUT/test_cuda.xml" tests/workers/engine/test_cuda.py
# an 8 GiB KV pool (65k tokens of an 8B model): the default 256 MiB holds no 2048-token prefill
KVGATE_WORKER_MODEL=$MODEL KVGATE_WORKER_KV_POOL_BYTES=$((8 << 30)) \
    step "${GPU_ENGINE_S:-90}" "bench engine" $PY "${ENGINE_ARGS[@]}"
KVGATE_WORKER_MODEL=$MODEL step "$(( ${GPU_MULTITURN_S:-170} + 20 ))" "bench multiturn" \
    $PY "${MULTITURN_ARGS[@]}"
cp docs/benchmarks/multiturn_cuda.md "$OUT/" 2>/dev/null
if [ "$HAS_SGLANG" = 1 ]; then
    step "${GPU_SGLANG_S:-120}" "SGLang over our tiers" $PY "${SGLANG_CHECK[@]}"
else
    echo "=== SGLang over our tiers: skipped, SGLang does not import here" | tee "$OUT/sglang_tiers.txt"
fi
# the workers' logs, for reading what went wrong (the runs' scratch directories)
(cd /tmp && tar czf "$OUT/logs.tgz" kvbench-*/logs kvgate-tiers-check-*/logs) 2>/dev/null
exit $FAILED
