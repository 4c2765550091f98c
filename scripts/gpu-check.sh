#!/usr/bin/env bash
# The checks and benchmarks that need a CUDA GPU, in one run (CI has no GPU):
#   1. tests/workers/engine/test_cuda.py: the engine against transformers on the GPU, seeded sampling,
#      KV restored from host RAM and the NAS bit for bit (fp32 and bf16);
#   2. `kvgate bench engine` on an 8B-sized random Llama in bf16, transformers beside it;
#   3. `kvgate bench multiturn --compare --quick` on that model (recompute, host, nas: no
#      object store on the GPU machine), written as docs/benchmarks/multiturn_cuda.json.
# Results and one log go to $OUT (default ./gpu-out). Optional inputs, for a machine without
# package registries: .whl/ (wheels installed into /tmp/site) and .gpu/tokenizer (written by
# `kvgate models export-tokenizer smollm2-135m-instruct .gpu/tokenizer`).
# Each step has its own time limit, so one that hangs still leaves the others' results.
# GPU_EXTRA names one more Python script to run first (a profile, say).
set -uo pipefail
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
[ -d .gpu/tokenizer ] && export KVGATE_WORKER_TOKENIZER=$PWD/.gpu/tokenizer
MODEL=${GPU_MODEL:-random:llama-3.1-8b}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'

step() {  # step SECONDS NAME COMMAND...
    local limit=$1 name=$2 start=$SECONDS
    shift 2
    echo "=== $name (limit ${limit}s)"
    timeout --kill-after=10 "$limit" "$@"
    echo "=== $name: exit $? after $((SECONDS - start)) s"
}

[ -n "${GPU_EXTRA:-}" ] && step "${GPU_EXTRA_S:-60}" "$GPU_EXTRA" python3 "$GPU_EXTRA"
step "${GPU_TEST_S:-120}" tests python3 -m pytest -q -p no:cacheprovider -o addopts= \
    tests/workers/engine/test_cuda.py
# an 8 GiB KV pool (65k tokens of an 8B model): the default 256 MiB holds no 2048-token prefill
KVGATE_WORKER_MODEL=$MODEL KVGATE_WORKER_KV_POOL_BYTES=$((8 << 30)) \
    step "${GPU_ENGINE_S:-150}" "bench engine" \
    python3 -m kvgate bench engine --quick --out "$OUT/engine_cuda.md" --json "$OUT/engine_cuda.json"
# GPU_MULTITURN_ARGS narrows the run to fit a short lease, e.g. "--max-requests 16"
KVGATE_WORKER_MODEL=$MODEL step "${GPU_MULTITURN_S:-300}" "bench multiturn" \
    python3 -m kvgate bench multiturn --compare --quick --configs "${GPU_CONFIGS:-recompute,host,nas}" \
    ${GPU_MULTITURN_ARGS:-} --name multiturn_cuda --json "$OUT/multiturn_cuda.json"
cp docs/benchmarks/multiturn_cuda.md "$OUT/" 2>/dev/null
# the workers' logs, for reading what went wrong (the run's scratch directories)
(cd /tmp && tar czf "$OUT/logs.tgz" kvbench-*/logs) 2>/dev/null
exit 0
