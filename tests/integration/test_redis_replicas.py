"""Two router replicas and a compiler sharing a real redis-server: the registry is shared and versioned."""

import time
import uuid

import pytest

from services.common.clients import NexusClient
from tests.conftest import start_compiler, start_router

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def replicas(redis_url):
    # A fresh database namespace per run: use a db index nobody else uses in this session.
    url = redis_url.rsplit("/", 1)[0] + "/3"
    import redis

    redis.Redis.from_url(url).flushdb()
    compiler = start_compiler(url)
    a = start_router(url, compiler.addr, registry_poll_s=0.2)
    b = start_router(url, compiler.addr, registry_poll_s=0.2)
    yield a, b, compiler
    for s in (a, b, compiler):
        s.stop()


def _wait_for(pred, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.1)
    return False


def test_replica_picks_up_registry_changes(replicas, small_tools):
    a, b, _ = replicas
    ca, cb = NexusClient(router=a.addr), NexusClient(router=b.addr)
    name = f"tool_{uuid.uuid4().hex[:6]}"
    reg = ca.register([t.to_json() for t in small_tools] + [
        {"name": name, "description": "Water the office plants on a schedule",
         "inputSchema": {"type": "object", "properties": {"when": {"type": "string"}}}}])
    assert _wait_for(lambda: cb.list_tools().registry_version >= reg.registry_version)
    assert cb.route("water the office plants tomorrow").tool == name
    ca.router.RemoveTools(__import__("nexus.v1.router_pb2", fromlist=["x"]).RemoveToolsRequest(names=[name]))
    assert _wait_for(lambda: name not in [t.name for t in cb.list_tools().tools])
    ca.close()
    cb.close()
