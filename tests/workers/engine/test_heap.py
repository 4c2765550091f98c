"""A serving process keeps what a step frees: a repeated prefill faults no pages in.

Each measurement runs in a process of its own (the allocator's settings are the process'),
set up as ``kvgate worker`` sets itself up, with and without the heap settings.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from kvgate.wiring import engine as wiring

#: Minor page faults of each of five prefills of the same 2,048-token prompt.
SCRIPT = """
import asyncio, json, resource, sys
from kvgate.bench.engine import engine_prefill_tps, random_prompts
from kvgate.wiring.engine import cores_to_the_engine, load_model, running_engine
from kvgate.wiring.engine import serving_process, worker_options

setup = serving_process if sys.argv[1] == "serving" else cores_to_the_engine
options = setup(worker_options(model=sys.argv[2]))
loaded = load_model(options)

async def main():
    with running_engine(loaded, options) as engine:
        prompt = random_prompts(1, 2048, loaded.config.vocab_size, 1)[0]
        faults = []
        for _ in range(5):
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            await engine_prefill_tps(engine, prompt)
            faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
        print(json.dumps(faults))

asyncio.run(main())
"""


#: glibc's default mmap threshold, set explicitly: so set, glibc no longer raises it by
#: itself when a large block is freed, which it otherwise does at a point that varies from
#: run to run (one plain run faulted 165,463, 13,252, 0, 97 and 0 pages, another 162,000
#: over the four warm prefills), and the plain side then faults what the defaults fault
#: before they adapt, every time
FIXED_DEFAULTS = {"MALLOC_MMAP_THRESHOLD_": str(128 * 1024)}


def _prefill_faults(setup: str, gguf: Path, **env_vars: str) -> list[int]:
    env = {**os.environ, "KVGATE_HOME": str(gguf.parent.parent), **env_vars}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, setup, str(gguf)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_warm_prefill_faults_in_no_pages_in_a_serving_process(smollm2_gguf: Path) -> None:
    """Without the settings glibc returned a prefill's temporaries to the kernel and the
    next prefills faulted them in again: 162,000 pages over the four warm prefills of
    2,048 tokens of SmolLM2. With them the heap only grows to its high-water mark, which
    takes a prefill or two to settle (where each temporary falls varies from run to run):
    the four warm prefills faulted 0-6,400 pages in all, runs apart."""
    plain = _prefill_faults("cores-only", smollm2_gguf, **FIXED_DEFAULTS)
    serving = _prefill_faults("serving", smollm2_gguf)
    assert sum(plain[1:]) > 20_000, plain  # the test can tell the difference
    assert sum(serving[1:]) * 10 < sum(plain[1:]), (serving, plain)


def test_a_process_whose_allocator_keeps_its_defaults_says_so(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Where the settings cannot be applied (not glibc), serving goes on and logs why a
    step may fault its memory in (on a thread of its own, to keep pytest's torch threads)."""
    monkeypatch.setattr(wiring, "keep_freed_memory", lambda: False)
    caplog.set_level(logging.WARNING, logger=wiring.__name__)
    seen: list[int | None] = []
    thread = threading.Thread(
        target=lambda: seen.append(
            wiring.serving_process(wiring.worker_options(device="cpu")).engine.threads
        )
    )
    thread.start()
    thread.join()
    assert seen and seen[0]
    assert "allocator settings not applied" in caplog.text
