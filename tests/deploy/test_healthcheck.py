"""deploy/healthcheck.py against a real gRPC health server: exit 0 only when SERVING."""

from __future__ import annotations

import subprocess
import sys
from concurrent import futures

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from tests.conftest import free_port
from tests.deploy.checks import DEPLOY

SCRIPT = str(DEPLOY / "healthcheck.py")


@pytest.fixture
def health_server():
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield servicer, f"127.0.0.1:{port}"
    server.stop(0)


def probe(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=30, env=env)


def test_exit_code_follows_the_serving_status(health_server):
    servicer, addr = health_server
    servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
    out = probe(addr)
    assert out.returncode == 1 and "NOT_SERVING" in out.stderr  # warming up: not healthy yet
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    out = probe(addr)
    assert out.returncode == 0 and "SERVING" in out.stdout
    servicer.set("nexus.v1.RouterService", health_pb2.HealthCheckResponse.SERVING)
    assert probe(addr, "--service", "nexus.v1.RouterService").returncode == 0
    assert probe(addr, "--service", "nexus.v1.NoSuch").returncode == 1


def test_unreachable_server_is_exit_2():
    out = probe(f"127.0.0.1:{free_port()}", "--timeout", "1")
    assert out.returncode == 2 and "UNAVAILABLE" in out.stderr


def test_default_address_comes_from_the_service_port_env(health_server):
    servicer, addr = health_server
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    port = addr.rsplit(":", 1)[1]
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("NEXUS_")}
    env["NEXUS_COMPILER_PORT"] = port
    assert probe(env=env).returncode == 0
