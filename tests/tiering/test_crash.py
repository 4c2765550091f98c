"""A NAS writer killed in the middle of a block leaves nothing a reader would accept."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from tests.support.tiering import chain, namespace
from tiering.tiers.nas import NasConfig, NasTier

# The child writes one 64 MiB block in 1 MiB chunks, each write slowed down so that the
# parent can kill it half-way; the writes themselves are real.
_WRITER = textwrap.dedent(
    """
    import asyncio, os, sys, time
    import numpy as np
    from tiering.codec import make_block
    from tiering.keys import Namespace
    from tiering.tiers.nas import NasConfig, NasTier

    real_write = os.write
    def slow_write(fd, data):
        time.sleep(0.05)
        return real_write(fd, data)
    os.write = slow_write

    ns = Namespace("t", sys.argv[2], "uint8", 4)
    key = ns.page_keys([1, 2, 3, 4])[0]
    block = make_block(key, ns.digest, "uint8", (64 << 20,), np.ones(64 << 20, np.uint8))
    nas = NasTier(NasConfig(sys.argv[1], fsync=True, write_chunk=1 << 20))
    print(key.hex(), flush=True)
    asyncio.run(nas.put_many([block]))
    """
)


async def test_writer_killed_mid_block_leaves_no_readable_partial_block(nas_dir: Path) -> None:
    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(nas_dir), "model-x"],
        stdout=subprocess.PIPE,
        text=True,
        cwd=repo,
        env={**os.environ, "PYTHONPATH": str(repo)},
    )
    key = bytes.fromhex(proc.stdout.readline().strip())
    nas = NasTier(NasConfig(nas_dir))
    final = nas.path(key)
    deadline = time.monotonic() + 60
    tmp: list[Path] = []
    while time.monotonic() < deadline:
        tmp = [p for p in final.parent.glob(".*.tmp")] if final.parent.exists() else []
        if tmp and tmp[0].stat().st_size >= 4 << 20:  # a few chunks in, far from done
            break
        assert proc.poll() is None, "writer finished before it could be killed"
        time.sleep(0.01)  # polling interval, not synchronisation
    assert tmp, "writer never started its temporary file"
    proc.send_signal(signal.SIGKILL)
    proc.wait()

    assert not final.exists()
    assert await nas.get_many([key]) == [None]
    assert await nas.longest_prefix([key]) == 0
    # tierd sees the leftover as a temporary, never as a block
    assert [e.key for e in nas.scan()] == [None]
    nas.close()


async def test_rewrite_replaces_whole_block_atomically(nas_dir: Path) -> None:
    nas = NasTier(NasConfig(nas_dir, fsync=False))
    ns = namespace()
    old, new = chain(ns, 1, first_token=0)[0], chain(ns, 1, first_token=0, elems=512)[0]
    await nas.put_many([old])
    await nas.put_many([new])
    (got,) = await nas.get_many([old.key])
    assert got is not None and bytes(got.payload) == bytes(new.payload)
    assert [p.name for p in nas.path(old.key).parent.iterdir()] == [nas.path(old.key).name]
    nas.close()
