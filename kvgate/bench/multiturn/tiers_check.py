"""One conversation whose second turn must come back from our tiers, on a real server.

``scripts/gpu-check.sh`` runs this against SGLang on the GPU (``--engine sglang``): a
small random-weight Llama (``--load-format dummy``: no weights to carry) served with our
HiCache storage backend over a scratch NAS directory. The first turn is answered, its
pages reach the NAS (block files appear), ``/flush_cache`` empties SGLang's device cache
and its host pool, and the second turn, which resends the first, must find its history
in SGLang's L3, which is ours: ``sglext.cached_tokens_details.storage``. On a CPU
(``--engine builtin``, the script's dry run) the same conversation runs on the built-in
worker with no host RAM, so the second turn's cached tokens must come from the NAS.

Writes the figures as JSON (``--json``) and exits 1 when the check fails.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import httpx

from kvgate.bench.multiturn import stack
from kvgate.bench.multiturn.workload import words
from kvgate.stack.ports import free_port
from tiering.tiers.nas_files import SUFFIX

#: a small Llama for SGLang's dummy loader, with SmolLM2's vocabulary (its tokenizer)
TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 512,
    "intermediate_size": 1536, "num_hidden_layers": 4, "num_attention_heads": 8,
    "num_key_value_heads": 4, "head_dim": 64, "vocab_size": 49152,
    "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 100000.0,
    "hidden_act": "silu", "tie_word_embeddings": True, "torch_dtype": "bfloat16",
    "bos_token_id": 1, "eos_token_id": 2,
}  # fmt: skip
#: the first turn's document: SGLang prefetches from storage only past 256 tokens
HISTORY_WORDS = 1500
SGLANG_PAGE = 64
START_TIMEOUT_S = 600.0
WAIT_S = 60.0


@dataclass(frozen=True)
class Served:
    """A started server: where, its KV page, what its requests add to the body, and the
    share of a response's cached tokens that came from our tiers."""

    url: str
    page_tokens: int
    extra_body: dict[str, Any]
    from_tiers: Callable[[dict[str, Any]], int]


def blocks_on(nas: Path) -> int:
    """Pages written to the NAS directory ``nas`` (whole block files)."""
    return sum(1 for _ in nas.rglob(f"*{SUFFIX}"))


def _chat(served: Served, model: str, messages: list[dict[str, str]]) -> dict[str, Any]:
    body = {"model": model, "messages": messages, "max_tokens": 8, "temperature": 0}
    response = httpx.post(
        f"{served.url}/v1/chat/completions", json=body | served.extra_body, timeout=300
    )
    response.raise_for_status()
    return response.json()


def _flush(url: str) -> None:
    """Empty the server's device cache (SGLang: its host pool too); retried while it is
    still finishing a request (SGLang answers 400 then)."""
    deadline = time.monotonic() + WAIT_S
    while (response := httpx.post(f"{url}/flush_cache", timeout=60)).status_code != 200:
        if time.monotonic() > deadline:
            raise RuntimeError(f"/flush_cache kept answering {response.status_code}")
        time.sleep(0.5)  # the server is finishing the first turn: nothing to wait on but it


def play(served: Served, nas: Path, seed: int = 0) -> dict[str, Any]:
    """The conversation and its figures; ``ok`` says whether the second turn's cached
    tokens came from the tiers."""
    url = served.url
    model = httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]["id"]
    rng = random.Random(f"tiers-check-{seed}")
    messages = [
        {"role": "system", "content": "You answer questions about documents."},
        {"role": "user", "content": words(rng, HISTORY_WORDS) + "\n\n" + words(rng, 20)},
    ]
    first = _chat(served, model, messages)
    prompt = first["usage"]["prompt_tokens"]
    # pages below the last full one reach the NAS (write-through, then written behind)
    want = prompt // served.page_tokens - 1
    deadline = time.monotonic() + WAIT_S
    while blocks_on(nas) < want and time.monotonic() < deadline:
        time.sleep(0.2)  # a file appearing in a directory: nothing to wait on but it
    blocks = blocks_on(nas)
    _flush(url)
    answer = first["choices"][0]["message"]["content"] or ""
    messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": "why?"}]
    second = _chat(served, model, messages)
    details = second["usage"].get("prompt_tokens_details") or {}
    cached, tiers = int(details.get("cached_tokens") or 0), served.from_tiers(second)
    return {
        "first_prompt_tokens": prompt,
        "nas_blocks_after_first_turn": blocks,
        "second_prompt_tokens": second["usage"]["prompt_tokens"],
        "second_cached_tokens": cached,
        "second_cached_from_tiers": tiers,
        "ok": tiers >= served.page_tokens and tiers >= 0.9 * cached and cached >= prompt // 2,
    }


def _builtin_tiers(response: dict[str, Any]) -> int:
    details = response["usage"].get("prompt_tokens_details") or {}
    by_tier = details.get("cached_tokens_by_tier") or {}
    return sum(int(v) for t, v in by_tier.items() if t != "device")


def _sglang_tiers(response: dict[str, Any]) -> int:
    ext = response.get("sglext") or (response.get("choices") or [{}])[0].get("sglext") or {}
    return int((ext.get("cached_tokens_details") or {}).get("storage") or 0)


@contextlib.contextmanager
def builtin(nas: Path, logs: Path) -> Iterator[Served]:
    """The built-in worker (the model the settings name) over the NAS alone."""
    env = {"KVGATE_NAS_PATH": str(nas), "KVGATE_TIER_HOST_BYTES": "0"}
    site = stack.Site(dsn="", nas=nas, s3_prefix="", env=env)
    with stack.worker("tiers-check", "host,nas", site, logs) as url:
        page = int(os.environ.get("KVGATE_WORKER_PAGE_SIZE", "16"))
        yield Served(url, page, {}, _builtin_tiers)


def sglang_spec(root: Path, tokenizer: Path) -> Any:
    """The launch of SGLang on GPU 0 over ``root/nas``: a small random Llama (its config
    and ``tokenizer`` written under ``root``) with our storage backend."""
    from tiering.sglang.options import SGLangBackendOptions
    from workers.sglang.command import SGLangLaunchSpec

    model = root / "tiny-llama"
    model.mkdir(exist_ok=True)
    for f in tokenizer.iterdir():
        (model / f.name).write_bytes(f.read_bytes())
    config = json.dumps(TINY_LLAMA, sort_keys=True)
    (model / "config.json").write_text(config)
    # dummy weights are drawn from a fixed seed: the config names them
    fingerprint = "sha256:" + hashlib.sha256(config.encode()).hexdigest()
    backend = SGLangBackendOptions(
        nas_path=str(root / "nas"), model="tiny-llama", weights_fingerprint=fingerprint
    )
    return SGLangLaunchSpec(
        model=str(model), backend=backend, port=free_port(), page_size=SGLANG_PAGE,
        mem_fraction_static=0.3, hicache_size_gb=4, context_length=8192,
        extra_args=("--load-format", "dummy", "--disable-cuda-graph"),
    )  # fmt: skip


#: SGLang's own parser over an argv (a subprocess: it reconfigures the root logger)
_PARSE = """
import json, sys
from sglang.srt.server_args import prepare_server_args
a = prepare_server_args(json.loads(sys.argv[1]))
print(json.dumps({"load_format": str(a.load_format), "hicache_storage_backend":
                  a.hicache_storage_backend, "enable_cache_report": a.enable_cache_report}))
"""


def parsed_by_sglang(spec: Any) -> dict[str, Any]:
    """What SGLang's own argument parser makes of ``spec``'s command line."""
    from workers.sglang.command import server_args

    out = subprocess.run(
        [sys.executable, "-c", _PARSE, json.dumps(server_args(spec))],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    if out.returncode:
        raise RuntimeError(f"SGLang refused the command line: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


@contextlib.contextmanager
def sglang(root: Path, logs: Path, tokenizer: Path) -> Iterator[Served]:
    """SGLang started from :func:`sglang_spec`, until the block ends."""
    from workers.sglang.command import build_argv, build_env

    spec = sglang_spec(root, tokenizer)
    url = f"http://127.0.0.1:{spec.port}"
    env = {**os.environ, **build_env(spec, {})}
    logs.mkdir(parents=True, exist_ok=True)
    with open(logs / "sglang.log", "ab") as log:
        proc = subprocess.Popen(build_argv(spec), env=env, stdout=log, stderr=log)
        try:
            _wait_healthy(url, proc)
            details = {"return_cached_tokens_details": True}  # SGLang's per-source counts
            yield Served(url, SGLANG_PAGE, details, _sglang_tiers)
        finally:
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()


def _wait_healthy(url: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"SGLang exited with {proc.returncode}; see sglang.log")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        time.sleep(1.0)  # a server loading: nothing to wait on but its answer
    raise RuntimeError(f"SGLang did not answer {url}/health in {START_TIMEOUT_S:.0f} s")


@click.command()
@click.option("--engine", type=click.Choice(["builtin", "sglang"]), default="builtin")
@click.option(
    "--tokenizer",
    type=click.Path(file_okay=False, path_type=Path),
    envvar="KVGATE_WORKER_TOKENIZER",
    help="With sglang: a Hugging Face tokenizer directory of SmolLM2's vocabulary "
    "(`kvgate models export-tokenizer smollm2-135m-instruct DIR`).",
)
@click.option(
    "--parse-only",
    is_flag=True,
    help="With sglang: only check that SGLang's parser accepts the launch (no GPU needed).",
)
@click.option("--json", "json_path", type=click.Path(path_type=Path), required=True)
def main(engine: str, tokenizer: Path | None, parse_only: bool, json_path: Path) -> None:
    """Play one conversation, flush the server's cache between its turns, and check that
    the second turn's cached tokens came from our tiers."""
    if engine == "sglang" and tokenizer is None:
        raise click.UsageError("--engine sglang needs --tokenizer (or KVGATE_WORKER_TOKENIZER)")
    root = Path(tempfile.mkdtemp(prefix="kvgate-tiers-check-"))
    nas, logs = root / "nas", root / "logs"
    nas.mkdir()
    started = time.perf_counter()
    try:
        if parse_only:
            figures = {"parsed": parsed_by_sglang(sglang_spec(root, tokenizer)), "ok": True}  # type: ignore[arg-type]
        else:
            server = sglang(root, logs, tokenizer) if engine == "sglang" else builtin(nas, logs)  # type: ignore[arg-type]
            with server as served:
                figures = play(served, nas)
    except (RuntimeError, OSError, httpx.HTTPError, stack.PartError) as exc:
        figures = {"ok": False, "error": str(exc), "logs": str(logs)}
    figures |= {"engine": engine, "seconds": time.perf_counter() - started}
    # the pages and the model go; the logs stay when there is something to read in them
    shutil.rmtree(root if figures["ok"] else nas, ignore_errors=True)
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(figures, indent=2) + "\n")
    click.echo(json.dumps(figures))
    sys.exit(0 if figures["ok"] else 1)


if __name__ == "__main__":
    main()
