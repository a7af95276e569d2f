"""Shared fixtures: the real tool registry, a real redis-server, and real in-process servers on port 0."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The tests run SmolLM2-135M wherever a model is left to its default, speed mattering more there than the answer (the
# servers and `nexus up` they start inherit it); tests/e2e/test_default_model.py runs the shipped default itself.
os.environ.setdefault("NEXUS_DEFAULT_MODEL", "smollm2-135m")
from services.common.serve import free_port

REPO = Path(__file__).resolve().parents[1]




def load_bench(name: str):
    """A script of bench/ imported as a module (its pure parts are unit-tested; its runs are the bench's)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, REPO / "bench" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
TOOLS_DIR = REPO / "data" / "mcp_tools"  # the default registry lives in the checkout (data/README.md)
QUERIES = REPO / "data" / "queries" / "train.jsonl"


SMALL_SERVERS = ("time", "redis")


@pytest.fixture(scope="session")
def small_gate(tmp_path_factory) -> Path:
    """A gate model in its training form (torch weights, fp32 and INT8 graphs), trained small (one epoch) on the
    lines of two servers and their augment lines: for the tests of what training and export read. The shipped model
    (models/gate, var/models/gate) is the serving form: INT8 graph only."""
    from training.data import equivalents, load_augment, load_queries, load_registry
    from training.gate import GateHyperParams, train_gate

    out = tmp_path_factory.mktemp("small-gate") / "gate"
    registry = load_registry(TOOLS_DIR)
    names = {t.name for t in registry.tools if registry.server_of[t.name] in SMALL_SERVERS}
    lines = [ln for ln in load_queries(QUERIES) if ln.server in SMALL_SERVERS]
    augment = [ln for ln in load_augment(str(REPO / "data" / "routing_augment")) if ln.tool in names][:120]
    hp = GateHyperParams(seed=3, q_epochs=1, ce_epochs=1, q_batch=16, ce_batch_groups=16, val_fraction=0.25,
                         threads=1, ce_top_k=3)
    train_gate(lines, [t for t in registry.tools if t.name in names], out, hp, equivalents=equivalents,
               progress=False, extra=augment)
    return out


@pytest.fixture(scope="session")
def tools_dir() -> Path:
    return TOOLS_DIR


@pytest.fixture(scope="session")
def all_tools():
    from services.common.tools import load_registry_dir

    return load_registry_dir(str(TOOLS_DIR))


@pytest.fixture(scope="session")
def small_tools(all_tools):
    """A registry slice with near neighbours: GitHub, local git, time."""
    keep = {"github_create_pull_request", "github_list_pull_requests", "github_merge_pull_request",
            "github_create_issue", "github_list_issues", "github_get_file_contents", "github_create_branch",
            "github_search_repositories", "git_status", "git_commit", "git_log", "git_diff", "git_create_branch",
            "get_current_time", "convert_time", "brave_web_search", "read_text_file", "write_file"}
    tools = [t for t in all_tools if t.name in keep]
    assert len(tools) >= 15
    return tools


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """A real redis-server on a free loopback port, for the session."""
    exe = shutil.which("redis-server")
    if exe is None:
        pytest.fail("redis-server is not installed (apt-get install redis-server; .ci/run does this)")
    port = free_port()
    proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    import redis

    r = redis.Redis(host="127.0.0.1", port=port)
    for _ in range(100):
        try:
            r.ping()
            break
        except redis.exceptions.ConnectionError:
            time.sleep(0.05)
    else:
        proc.kill()
        pytest.fail("redis-server did not start")
    yield f"redis://127.0.0.1:{port}/0"
    proc.terminate()
    proc.wait(timeout=10)


@pytest.fixture
def redis_store(redis_url):
    import uuid

    from services.common.store import RedisStore

    store = RedisStore(redis_url, namespace=f"test-{uuid.uuid4().hex[:8]}")
    yield store
    store.close()


class ServerThread:
    """Runs one service's ``run(config, ready=..., stop_event=...)`` on its own loop in a thread."""

    def __init__(self, run: Callable, config):
        self.run, self.config = run, config
        self.port: int | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._main, daemon=True)

    def _main(self) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()

            def ready(port: int) -> None:
                self.port = port
                self._ready.set()

            await self.run(self.config, ready=ready, stop_event=self._stop)

        try:
            asyncio.run(main())
        except BaseException as e:  # noqa: BLE001 - surfaced by start()
            self._error = e
            self._ready.set()

    def start(self, timeout: float = 180) -> ServerThread:
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError("server did not become ready")
        if self._error is not None:
            raise self._error
        return self

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=30)


def start_compiler(store_url: str, **kw) -> ServerThread:
    """A compiler on port 0. Derived requests are off unless asked for (``derive=True``): the generator is a 491 MB
    model whose background work would share the two cores with every other test; tests/compiler/test_derive.py
    runs it for real."""
    from services.compiler.config import CompilerConfig
    from services.compiler.server import run

    kw.setdefault("derive", False)
    return ServerThread(run, CompilerConfig(port=0, store_url=store_url, grace_s=0.5, metrics_port=0, **kw)).start()


def start_engine(store_url: str, **kw) -> ServerThread:
    from services.engine.config import EngineConfig
    from services.engine.server import run

    return ServerThread(run, EngineConfig(port=0, store_url=store_url, grace_s=0.5, metrics_port=0, **kw)).start()


def start_router(store_url: str, compiler_addr: str, **kw) -> ServerThread:
    from services.router.config import RouterConfig
    from services.router.server import run

    cfg = replace(RouterConfig(), port=0, store_url=store_url, compiler_addr=compiler_addr, grace_s=0.5,
                  metrics_port=0, **kw)
    return ServerThread(run, cfg).start()


@pytest.fixture(scope="session")
def cluster(tmp_path_factory, small_tools):
    """Compiler, engine and router on the embedded (directory) store, with the small registry registered."""
    from services.common.clients import NexusClient

    store_url = str(tmp_path_factory.mktemp("store"))
    compiler = start_compiler(store_url)
    engine = start_engine(store_url)
    router = start_router(store_url, compiler.addr)
    client = NexusClient(router=router.addr, engine=engine.addr, compiler=compiler.addr, timeout_s=120)
    client.register([t.to_json() for t in small_tools])
    yield {"router": router, "engine": engine, "compiler": compiler, "client": client, "store_url": store_url}
    client.close()
    for s in (router, engine, compiler):
        s.stop()


@pytest.fixture(scope="session")
def grpcurl() -> str:
    from cli.main import grpcurl_path

    path = grpcurl_path()
    out = subprocess.run([path, "-version"], capture_output=True, text=True, timeout=30)
    assert "grpcurl" in (out.stdout + out.stderr), f"grpcurl at {path} did not run: {out}"
    return path
