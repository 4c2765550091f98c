"""The machine's floors the restore and no-reuse figures are held against, measured for real
and reported beside the figures they bound."""

from __future__ import annotations

import boto3
import pytest

from kvgate.bench.multiturn import floors, stack
from kvgate.bench.multiturn.docs import _floor_lines, findings
from kvgate.bench.multiturn.report import physics, verdicts
from kvgate.stack.seaweed import S3Endpoint
from tests.support.bench import recorded_run

#: 4096 tokens x 46080 bytes, the restore sample of ``_figures``
MOVED = 4096 * 46080


def test_the_floors_are_measured_and_leave_nothing_behind(tmp_path, s3_server: S3Endpoint) -> None:
    before = _objects(s3_server)
    got = floors.measure(
        history_bytes=8 << 20, page_bytes=360 << 10, nas_folder=tmp_path, fsync=False,
        s3=s3_server, bucket="kvtest",
    )  # fmt: skip
    assert got["history_bytes"] == 8 << 20 and got["page_bytes"] == 360 << 10
    for key in ("memory_copy_bytes_per_s", "object_get_bytes_per_s", "nas_page_write_cpu_s"):
        assert 0 < got[key] < float("inf"), key
    assert list(tmp_path.iterdir()) == []  # the written pages are gone
    assert _objects(s3_server) == before  # and so is the object


def test_without_an_object_store_there_is_no_object_floor(tmp_path) -> None:
    got = floors.measure(
        history_bytes=1 << 20, page_bytes=64 << 10, nas_folder=tmp_path, fsync=True,
        s3=None, bucket="kvtest",
    )  # fmt: skip
    assert "object_get_bytes_per_s" not in got and got["nas_page_write_cpu_s"] > 0


def _objects(endpoint: S3Endpoint) -> list[str]:
    s3 = boto3.client(
        "s3", endpoint_url=endpoint.url, aws_access_key_id=endpoint.access_key,
        aws_secret_access_key=endpoint.secret_key, region_name=endpoint.region,
    )  # fmt: skip
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket="kvtest", Prefix="floors-")
    return sorted(o["Key"] for page in pages for o in page.get("Contents", []))


def _with_floors(**overrides: object) -> dict:
    data = recorded_run(spec={}, **overrides)
    data["floors"] = {
        "history_bytes": MOVED,
        "page_bytes": 16 * 46080,
        "memory_copy_bytes_per_s": MOVED / 0.05,  # one copy: 0.05 s
        "object_get_bytes_per_s": MOVED / 0.1,  # one GET: 0.1 s
        "nas_page_write_cpu_s": 0.001,
    }
    data["targets"] = verdicts(data)
    return data


def _missed(data: dict, key: str) -> str:
    """The report's line for target ``key`` of ``data``, verdicts made afresh."""
    data.pop("figures", None)
    data["targets"] = verdicts(data)
    (line,) = [x for x in findings(data) if f"`{key}` missed" in x]
    return line


def test_the_restore_references_are_the_resident_turn_plus_one_pass_at_their_rate() -> None:
    f = _with_floors()["figures"]
    assert f["nas_vs_resident_ttft_floor"] == pytest.approx(1 + 0.05 / 0.2)
    assert f["object_vs_resident_ttft_single_get"] == pytest.approx(1 + 0.1 / 0.2)


def test_a_missed_restore_figure_says_what_moving_its_bytes_alone_would_read() -> None:
    assert _missed(_with_floors(), "object_vs_resident_ttft").endswith(
        "`object` delivered 269.63 MB/s; one GET of them as a single object, through the "
        "object tier's client, runs at 1.89 GB/s here: a restore doing nothing else would "
        "read 1.50)."
    )


def test_a_missed_no_reuse_figure_says_what_writing_the_pages_alone_takes() -> None:
    pair = {
        # 15,600 prompt and 400 answer tokens: 1,000 pages of 16, 1 ms each, over 20 s
        "on": {"wave_seconds": [9.0, 10.5, 9.5], "prompt_tokens": 15600, "output_tps": 20.0,
               "seconds": 20.0},
        "off": {"wave_seconds": [9.0, 10.0, 9.0]},
    }  # fmt: skip
    data = _with_floors(no_reuse=pair, machine={"cpus": 2})
    assert data["figures"]["no_reuse_write_cpu_share"] == pytest.approx(0.05)
    assert _missed(data, "no_reuse_overhead").endswith(
        "writing a page's file alone costs 1.00 ms of CPU here, 5.0% of the tiered waves' time)."
    )


def test_a_missed_docqa_speedup_names_the_ideals_own_speedup() -> None:
    data = recorded_run(spec={})
    data["workloads"]["docqa"]["configs"]["nas"]["rps"] = 1.0  # 10x, where the ideal gives 20x
    assert _missed(data, "docqa_speedup_rps") == (
        "- `docqa_speedup_rps` missed: 10.000 against >= 15 (`infinite`, the ideal, serves "
        "20.00x recompute's requests/s on this machine and workload (`docqa_speedup_bound`): "
        "the speedup no cache can pass here)."
    )


def test_a_run_without_floors_reports_its_figures_as_before() -> None:
    data = recorded_run(spec={})
    line = _missed(data, "object_vs_resident_ttft")
    assert data["figures"]["nas_vs_resident_ttft_floor"] is None
    assert line.endswith("`object` delivered 269.63 MB/s).")
    assert _floor_lines(None) == []


def test_the_physics_section_states_the_floors() -> None:
    data = _with_floors()
    text = "\n".join(_floor_lines(physics(data)["floors"]))
    assert "One copy of the restore turn's 189 MB of KV in memory runs at 3.77 GB/s" in text
    assert "One GET of those 189 MB stored as a single object runs at 1.89 GB/s" in text
    assert "Writing one 720 KiB page as a NAS file" in text and "costs 1.00 ms of CPU" in text


def test_a_floor_that_cannot_be_measured_is_reported_not_raised(tmp_path) -> None:
    svc = stack.Services(dsn="", s3=None, root=tmp_path / "gone")  # no such directory
    got = floors.for_restore(svc, 46080, {})
    assert got == {"error": got["error"]} and "the floors were not measured" in got["error"]


def test_a_missed_chat_comparison_shows_its_timings_and_a_machine_that_moved() -> None:
    data = recorded_run(spec={})
    chat = data["workloads"]["chat"]["configs"]
    chat["nas"] |= {"rps": 0.85, "ttft_p50": 1.2, "tpot_p50": 0.058}
    chat["infinite"] |= {"tpot_p50": 0.054}
    chat["recompute"] |= {"tpot_p50": 0.059}
    assert _missed(data, "efficiency_rps_nas") == (
        "- `efficiency_rps_nas` missed: 0.810 against >= 0.92 (`infinite` TTFT p50 0.90 s, "
        "time per output token 0.054 s; `nas` TTFT p50 1.20 s, time per output token 0.058 s; "
        "`recompute` TTFT p50 8.00 s, time per output token 0.059 s: `recompute`, which has "
        "no tiers, decoded 9% slower than `infinite`, so the machine's speed moved between "
        "the configurations)."
    )
    chat["recompute"]["tpot_p50"] = 0.055  # decode held steady: no word about the machine
    assert _missed(data, "efficiency_rps_nas").endswith(
        "`recompute` TTFT p50 8.00 s, time per output token 0.055 s)."
    )
