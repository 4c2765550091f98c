#!/usr/bin/env bash
# Install SGLang 0.5.23 into the project venv for the tests, without its GPU dependencies.
#
# The tests load our HiCache storage backend through SGLang's own StorageBackendFactory
# and parse our launch command with SGLang's own ServerArgs, so they need SGLang's Python
# code but not its CUDA kernels. `--no-deps` keeps pip from replacing the CPU torch pinned
# in constraints.txt (SGLang pins a CUDA torch); the packages listed after it are the
# pure-Python imports of sglang.srt.mem_cache.hicache_storage, the storage backend factory
# and sglang.srt.server_args. Idempotent: does nothing when the right version is present.
#
# Usage: scripts/install-sglang-test-deps.sh [VENV]   (default: .venv)
set -euo pipefail

cd "$(dirname "$0")/.."
venv="${1:-.venv}"
python="$venv/bin/python"
pip=("$venv/bin/pip" install --quiet --disable-pip-version-check -c constraints.txt)

if "$python" - <<'EOF' 2>/dev/null; then
import importlib.metadata as md, sys
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory  # noqa: F401
from sglang.srt.server_args import prepare_server_args  # noqa: F401
sys.exit(0 if md.version("sglang") == "0.5.23" else 1)
EOF
    echo "sglang 0.5.23 test dependencies already installed"
    exit 0
fi

"${pip[@]}" --no-deps "sglang==0.5.23"
"${pip[@]}" numpy orjson psutil pybase64 requests packaging pillow msgspec pydantic \
    pyzmq tqdm IPython aiohttp triton
"$python" -c "from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory; from sglang.srt.server_args import prepare_server_args"
echo "sglang 0.5.23 test dependencies installed"
