"""What a multi-turn comparison runs on: the machine, the served model, a scratch directory.

Every report names these, so that a figure can be traced to the CPU, the load, the model
and the KV dtype it came from.
"""

from __future__ import annotations

import os
import platform
import tempfile
import time
from pathlib import Path

from kvgate.bench.output import cpu_name

DOCS = Path("docs")


def kv_bytes_per_token() -> int:
    """KV bytes per token of the model the benchmark workers serve, at their KV dtype
    (``KVGATE_WORKER_MODEL``, ``KVGATE_WORKER_DEVICE`` and ``KVGATE_WORKER_KV_DTYPE``)."""
    from kvgate.models.registry import DEFAULT_MODEL, ensure_model
    from kvgate.wiring.engine import worker_options
    from workers.engine.weights import model_config

    options = worker_options()
    spec = options.model or ensure_model(options.models_dir, DEFAULT_MODEL)
    return options.engine.kv_bytes_per_token(model_config(spec))


def prepare_served_model() -> None:
    """Convert the served model into its cache and build the native kernel, here and once.

    A worker's start is timed by the calibration and counted for every configuration's
    start in the budget; a first start that also converted the GGUF took 14.5 s where the
    others took 3.5, and the run then planned for four times the starts it had."""
    from kvgate.wiring.engine import load_model, worker_options
    from workers.engine import native

    load_model(worker_options())  # the conversion is what is wanted; the weights go
    native.load()


def served_model() -> dict[str, str]:
    """The model the benchmark workers serve, the device and dtype they run it in, and the
    dtype of its KV (what the tiers move)."""
    from kvgate.models.registry import served_model_id
    from kvgate.wiring.engine import worker_options

    options = worker_options()
    return {"model": served_model_id(options.model), "engine": options.engine.describe()}


def machine() -> dict[str, object]:
    """What the figures were measured on, including how busy the machine was."""
    import torch

    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    return {
        "platform": platform.platform(),
        "gpu": gpu,
        "processor": platform.processor() or platform.machine(),
        "cpu": cpu_name(),
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "load_average_at_start": os.getloadavg(),
    }


def run_dir() -> Path:
    """A scratch directory for one comparison's services and logs."""
    return Path(tempfile.mkdtemp(prefix=f"kvbench-{time.strftime('%H%M%S')}-"))
