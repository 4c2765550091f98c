"""The fault proxy of ``kvgate bench faults`` in front of a real SeaweedFS, driven by boto3:
requests pass unchanged (signatures hold, HEAD keeps the object's size) until a fault is
set, and then fail the way that fault says."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

import boto3
import botocore.exceptions
import pytest
from botocore.config import Config

from kvgate.bench.faults.proxy import Fault, FaultProxy
from kvgate.stack.ports import free_port
from kvgate.stack.seaweed import S3Endpoint

T = TypeVar("T")


class Running:
    """The proxy on an event loop of its own thread (boto3 blocks)."""

    def __init__(self, upstream: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.proxy = FaultProxy(upstream, "127.0.0.1", free_port(), free_port())
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        self.call(self.proxy.start())

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=30)

    def close(self) -> None:
        self.call(self.proxy.close())
        self.loop.call_soon_threadsafe(self.loop.stop)


@pytest.fixture
def proxied(s3_server: S3Endpoint) -> Iterator[tuple[Running, object]]:
    running = Running(s3_server.url)
    client = boto3.client(
        "s3",
        endpoint_url=f"http://127.0.0.1:{running.proxy.port}",
        aws_access_key_id=s3_server.access_key,
        aws_secret_access_key=s3_server.secret_key,
        region_name=s3_server.region,
        config=Config(retries={"total_max_attempts": 1}, connect_timeout=2, read_timeout=10),
    )
    yield running, client
    running.close()


def test_requests_pass_unchanged_until_a_fault_is_set(proxied) -> None:
    running, s3 = proxied
    s3.put_object(Bucket="kvtest", Key="proxy/a", Body=b"x" * 1000)
    assert s3.get_object(Bucket="kvtest", Key="proxy/a")["Body"].read() == b"x" * 1000
    assert s3.head_object(Bucket="kvtest", Key="proxy/a")["ContentLength"] == 1000
    with pytest.raises(botocore.exceptions.ClientError) as missing:
        s3.head_object(Bucket="kvtest", Key="proxy/none")
    assert missing.value.response["Error"]["Code"] == "404"
    assert running.proxy.injected_errors == 0


def test_every_nth_request_is_a_503_slow_down(proxied) -> None:
    running, s3 = proxied
    s3.put_object(Bucket="kvtest", Key="proxy/b", Body=b"y")
    running.call(running.proxy.set_fault(Fault(error_every=2)))
    codes = []
    for _ in range(4):
        try:
            s3.get_object(Bucket="kvtest", Key="proxy/b")["Body"].read()
            codes.append("ok")
        except botocore.exceptions.ClientError as exc:
            codes.append(exc.response["Error"]["Code"])
    assert sorted(codes) == ["SlowDown", "SlowDown", "ok", "ok"]
    assert running.proxy.injected_errors == 2


def test_down_refuses_connections_and_up_serves_again(proxied) -> None:
    running, s3 = proxied
    s3.put_object(Bucket="kvtest", Key="proxy/c", Body=b"z")
    running.call(running.proxy.set_fault(Fault(down=True)))
    with pytest.raises(botocore.exceptions.EndpointConnectionError):
        s3.get_object(Bucket="kvtest", Key="proxy/c")
    running.call(running.proxy.set_fault(Fault()))
    assert s3.get_object(Bucket="kvtest", Key="proxy/c")["Body"].read() == b"z"


@pytest.mark.parametrize(
    ("body", "field"),
    [([], "object"), ({"down": 1}, "down"), ({"error_every": -1}, "error_every"),
     ({"delay_s": "x"}, "delay_s"), ({"slow": True}, "unknown")],
)  # fmt: skip
def test_a_bad_fault_names_what_is_wrong(body: object, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        Fault.parse(body)
