"""``kvgate bench soak``'s judgement: growth after warm-up, and tiers against their limits."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import click
import pytest

from kvgate.bench.soak import _wait_for_model
from kvgate.bench.soak_verdicts import LIMITS, MIB, Samples, growth, lived_growth, verdicts


def test_growth_ignores_the_warm_up_and_sees_what_keeps_rising() -> None:
    warm_then_flat = [10, 50, 90, *[100] * 47]
    assert growth(warm_then_flat) == 0.0
    leaking = [100 + 2 * i for i in range(50)]
    assert growth(leaking) > 0.2  # 149 after warm-up (two fifths), 189 at the end
    with pytest.raises(click.ClickException, match="too few"):
        growth([1, 2, 3])


def _one_process(series: list[int]) -> dict[str, list[int | None]]:
    return {"100": list(series)}


def test_verdicts_flag_a_growing_part_and_a_tier_over_its_limit() -> None:
    n = 50
    flat, rising = [80 * MIB] * n, [400 * MIB + i * 4 * MIB for i in range(n)]
    samples = Samples(
        t=list(range(n)),
        # Postgres' backends touching more of the shared buffer cache: RSS rises, their heap not
        rss={"gateway": flat, "worker": rising, "postgres": rising},
        pss={"gateway": flat, "worker": rising, "postgres": rising},
        procs={"gateway": [1] * n, "worker": [1] * n, "postgres": [1] * n},
        fds={"gateway": [30] * n, "worker": [40] * n, "postgres": [300] * n},
        nas=[LIMITS["nas_high"] // 2] * (n - 1) + [LIMITS["nas_max"] + 1],
        objects=[0] * n,
        lived={
            "gateway": _one_process(flat),
            "worker": _one_process(rising),
            "postgres": _one_process(flat),
        },
    )
    found = verdicts(samples)
    assert found["parts"]["gateway"]["ok"] and not found["parts"]["worker"]["ok"]
    assert found["parts"]["postgres"]["ok"] and found["parts"]["postgres"]["memory"] == "anon"
    assert found["parts"]["postgres"]["rss_growth"] > 0.05  # RSS alone would have flagged it
    assert not found["tiers"]["ok"]  # the NAS ended above its cap


def test_the_nas_is_judged_by_its_cap_and_its_high_watermark_only_reported() -> None:
    """tierd demotes above the high watermark, so the NAS passes it between checks; the
    cap is the limit writers keep to."""
    n = 50
    flat = [80 * MIB] * n
    samples = Samples(
        t=list(range(n)),
        rss={"tierd": flat},
        pss={"tierd": flat},
        procs={"tierd": [1] * n},
        fds={"tierd": [20] * n},
        nas=[LIMITS["nas_high"] + 1] * (n // 2) + [LIMITS["nas_max"]] * (n - n // 2),
        objects=[LIMITS["object_max"]] * n,
        lived={"tierd": _one_process(flat)},
    )
    tiers = verdicts(samples)["tiers"]
    assert tiers["ok"] and tiers["nas_over_limit_share"] == 0
    assert tiers["nas_over_high_share"] == 1.0


def _pool(n: int, swell: int) -> Samples:
    """Postgres' processes over ``n`` samples: a postmaster and 14 backends that live
    throughout, each steady at 3 MiB, or ``swell`` bytes more every sample; one backend
    that closes at a quarter of the run; two that open at half of it."""
    samples = Samples()
    for i in range(n):
        samples.t.append(float(i))
        by_pid = {str(pid): 3 * MIB + i * swell for pid in range(100, 115)}
        if i < n // 4:
            by_pid["200"] = 5 * MIB
        if i >= n // 2:
            by_pid |= {"300": 4 * MIB, "301": 4 * MIB}
        samples.add_lived({"postgres": by_pid})
        samples.procs.setdefault("postgres", []).append(len(by_pid))
    return samples


def test_lived_samples_mark_the_processes_that_were_not_there() -> None:
    samples = _pool(20, swell=0)
    lived = samples.lived["postgres"]
    assert all(len(series) == 20 for series in lived.values())
    assert lived["200"] == [5 * MIB] * 5 + [None] * 15
    assert lived["300"] == [None] * 10 + [4 * MIB] * 10


def test_memory_is_judged_by_the_processes_that_lived_so_a_pool_is_no_leak() -> None:
    """A 30-minute soak saw Postgres' sum go up and down with its pools (11 to 17
    processes); a process whose own memory rises is still a leak."""
    steady = _pool(50, swell=0)
    sums = [sum(s[i] or 0 for s in steady.lived["postgres"].values()) for i in range(50)]
    assert growth(sums) > 0.05  # the sum alone would flag a pool that opened two backends
    assert lived_growth(steady.lived["postgres"]) == (0.0, 45 * MIB, 45 * MIB, 15)
    swelling = lived_growth(_pool(50, swell=64 << 10).lived["postgres"])
    assert swelling[0] > 0.05 and swelling[3] == 15


def test_descriptors_are_judged_per_process_and_only_when_they_rise() -> None:
    """A pool closing one of Postgres' backends (~30 files) is no leak, nor is a part
    ending with fewer descriptors; one process gaining descriptors is."""
    n = 50
    flat = [80 * MIB] * n
    backends = [16] * (3 * n // 5) + [15] * (n - 3 * n // 5)  # one closed after the third fifth
    pool = [b * 3 * MIB for b in backends]
    samples = Samples(
        t=list(range(n)),
        rss={"postgres": pool, "gateway": flat, "tierd": flat},
        pss={"postgres": pool, "gateway": flat, "tierd": flat},
        procs={"postgres": backends, "gateway": [1] * n, "tierd": [1] * n},
        fds={
            "postgres": [30 * b for b in backends],
            "gateway": [40] * (3 * n // 5) + [20] * (n - 3 * n // 5),
            "tierd": [20 + i for i in range(n)],
        },
        nas=[0] * n,
        objects=[0] * n,
        lived={
            "postgres": _one_process(flat),
            "gateway": _one_process(flat),
            "tierd": _one_process(flat),
        },
    )
    parts = verdicts(samples)["parts"]
    assert parts["postgres"]["ok"] and parts["postgres"]["fds_change"] == 0
    assert parts["gateway"]["ok"] and parts["gateway"]["fds_change"] == -20
    assert not parts["tierd"]["ok"] and parts["tierd"]["fds_change"] > 4


def test_descriptors_that_come_and_go_with_connections_are_no_leak() -> None:
    """SeaweedFS in a soak: 137 to 171 descriptors, its client connections following the
    load; the last fifth's median beat the third's by 5.5 but never what it had reached."""
    n = 50
    flat = [200 * MIB] * n
    connections = [171 if i % 7 == 0 else 164 for i in range(n)]
    connections[-5:] = [171] * 5  # a busy end: the median of the last fifth is 171
    samples = Samples(
        t=list(range(n)),
        rss={"s3": flat},
        pss={"s3": flat},
        procs={"s3": [1] * n},
        fds={"s3": connections},
        nas=[0] * n,
        objects=[0] * n,
        lived={"s3": _one_process(flat)},
    )
    s3 = verdicts(samples)["parts"]["s3"]
    assert s3["fds_change"] > 4 and s3["ok"]


class _Models(BaseHTTPRequestHandler):
    """``GET /v1/models``: an empty list for the first ``empty`` calls, then ``listed``."""

    empty = 0
    listed = ("tiny-random",)
    calls = 0

    def do_GET(self) -> None:
        cls = type(self)
        cls.calls += 1
        models = [] if cls.calls <= cls.empty else [{"id": m} for m in cls.listed]
        body = json.dumps({"object": "list", "data": models}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def models_server() -> Iterator[type[_Models]]:
    handler = type("Models", (_Models,), {"calls": 0})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    handler.url = f"http://127.0.0.1:{server.server_address[1]}"  # type: ignore[attr-defined]
    try:
        yield handler
    finally:
        server.shutdown()
        server.server_close()


def test_the_load_waits_until_the_gateway_lists_the_model(models_server: type[_Models]) -> None:
    models_server.empty = 3  # the worker's registration reaches the gateway a while after
    _wait_for_model(models_server.url, "kvg_x", "tiny-random", 30)  # type: ignore[attr-defined]
    assert models_server.calls == 4


def test_a_model_never_listed_stops_the_soak_with_what_is_listed(
    models_server: type[_Models],
) -> None:
    models_server.listed = ("other-model",)
    with pytest.raises(click.ClickException, match=r"did not list model 'tiny-random'.*other"):
        _wait_for_model(models_server.url, "kvg_x", "tiny-random", 0.5)  # type: ignore[attr-defined]
