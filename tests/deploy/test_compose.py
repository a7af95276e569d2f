"""deploy/docker-compose.yml: router + compiler + Redis + the OpenAI-compatible front. Validated by the real `docker-compose config`
(Debian's docker-compose 1.29) when installed, and by reference checks on the parsed file."""

from __future__ import annotations

import os
import shutil
import subprocess
from urllib.parse import urlsplit

import pytest
import yaml

from tests.deploy.checks import (
    DEFAULT_PORTS,
    DEPLOY,
    REPO,
    config_problems,
    env_dict,
    image_problems,
    interpolate,
)

COMPOSE = DEPLOY / "docker-compose.yml"
ENV = {"REDIS_PASSWORD": "0123abcd"}  # what deploy/.env provides


@pytest.fixture(scope="module")
def compose() -> dict:
    return interpolate(yaml.safe_load(COMPOSE.read_text()), ENV)


def _compose_cli(env_extra: dict[str, str], tmp_path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if k not in ("REDIS_PASSWORD", "NEXUS_TAG", "NEXUS_LOG_LEVEL", "ROUTER_PUBLISH", "REDIS_PUBLISH_PORT",
                        "OPENAI_PUBLISH", "NEXUS_ENGINE_ADDR", "NEXUS_OPENAI_MODEL_NAME", "NEXUS_OPENAI_AUTH_TOKEN")}
    env.update(env_extra)
    # An empty --env-file: a developer's deploy/.env must not change what the test sees.
    empty = tmp_path / "empty.env"
    empty.write_text("")
    return subprocess.run(["docker-compose", "--env-file", str(empty), "-f", str(COMPOSE), "config"],
                          capture_output=True, text=True, timeout=60, env=env, cwd=DEPLOY)


needs_compose = pytest.mark.skipif(shutil.which("docker-compose") is None,
                                   reason="docker-compose not installed (apt-get install docker-compose)")


@needs_compose
def test_docker_compose_config_accepts_the_file(compose, tmp_path):
    out = _compose_cli(ENV, tmp_path)
    assert out.returncode == 0, out.stderr
    resolved = yaml.safe_load(out.stdout)
    assert set(resolved["services"]) == {"redis", "router", "compiler", "openai"}
    for name, svc in resolved["services"].items():
        assert svc["healthcheck"]["test"] == compose["services"][name]["healthcheck"]["test"]
        assert env_dict(svc.get("environment")) == env_dict(compose["services"][name].get("environment"))
    assert resolved["services"]["router"]["depends_on"] == {
        "compiler": {"condition": "service_healthy"}, "redis": {"condition": "service_healthy"}}


@needs_compose
def test_docker_compose_refuses_to_start_without_a_redis_password(tmp_path):
    out = _compose_cli({}, tmp_path)
    assert out.returncode != 0 and "REDIS_PASSWORD" in out.stderr


def test_engine_is_not_in_compose_and_every_service_has_a_healthcheck(compose):
    services = compose["services"]
    assert set(services) == {"redis", "router", "compiler", "openai"}
    for name, svc in services.items():
        assert svc["healthcheck"]["test"], name
    for name in ("router", "compiler"):
        port = DEFAULT_PORTS[name]
        assert services[name]["healthcheck"]["test"] == ["CMD", "python", "/opt/nexus/healthcheck.py",
                                                         f"127.0.0.1:{port}"]
        assert env_dict(services[name]["environment"])[f"NEXUS_{name.upper()}_PORT"] == str(port)
        assert services[name]["healthcheck"]["start_period"]  # warm-up loads models


def test_builds_point_at_existing_dockerfiles(compose):
    for name in ("router", "compiler"):
        build = compose["services"][name]["build"]
        context = (DEPLOY / build["context"]).resolve()
        assert context == REPO
        assert (context / build["dockerfile"]) == DEPLOY / name / "Dockerfile"
        assert image_problems(compose["services"][name]["image"]) == []


def test_env_is_valid_service_config_and_addresses_resolve(compose):
    services = compose["services"]
    for name in ("router", "compiler"):
        env = env_dict(services[name]["environment"])
        assert config_problems(env, f"compose {name}") == []
        store = urlsplit(env[f"NEXUS_{name.upper()}_STORE_URL"])
        assert store.scheme == "redis" and store.hostname in services and store.port == 6379
        assert store.password == ENV["REDIS_PASSWORD"]
        assert store.hostname in services[name]["depends_on"]
    host, port = env_dict(services["router"]["environment"])["NEXUS_ROUTER_COMPILER_ADDR"].split(":")
    assert host == "compiler" and int(port) == DEFAULT_PORTS["compiler"]
    assert str(port) in services["compiler"]["expose"]
    assert services["router"]["depends_on"]["compiler"]["condition"] == "service_healthy"


def test_volumes_and_hardening(compose):
    declared = set(compose["volumes"])
    for name, svc in compose["services"].items():
        for v in svc.get("volumes", []):
            src = v.split(":")[0]
            if not src.startswith((".", "/")):
                assert src in declared, f"{name}: volume {src} is not declared"
        assert svc["read_only"] is True and svc["cap_drop"] == ["ALL"], name
        assert "no-new-privileges:true" in svc["security_opt"], name
    assert "redis-data:/data" in compose["services"]["redis"]["volumes"]
    # Redis is published on loopback only (for the engine on this host), never on every interface.
    assert all(p.startswith("127.0.0.1:") for p in compose["services"]["redis"]["ports"])
    assert image_problems(compose["services"]["redis"]["image"]) == []


def test_env_example_lists_every_variable_the_compose_file_uses():
    import re

    used = set(re.findall(r"\$\{(\w+)", COMPOSE.read_text()))
    example = dict(line.split("=", 1) for line in (DEPLOY / ".env.example").read_text().splitlines()
                   if line and not line.startswith("#"))
    assert used <= set(example), used - set(example)


def test_the_openai_front_runs_from_the_router_image_and_checks_its_http_health(compose):
    """The front: the router's image and build, `nexus serve openai`, NEXUS_OPENAI_* env its config accepts, the
    router by service name and the native engine on the host, published on 8000, healthy on GET /health = 200."""
    services = compose["services"]
    front = services["openai"]
    assert front["image"] == services["router"]["image"] and front["build"] == services["router"]["build"]
    assert front["entrypoint"] == ["nexus", "serve", "openai"]
    env = env_dict(front["environment"])
    assert config_problems(env, "compose openai") == []
    assert all(k.startswith("NEXUS_OPENAI_") for k in env)
    assert env["NEXUS_OPENAI_PORT"] == str(DEFAULT_PORTS["openai"]) and env["NEXUS_OPENAI_HOST"] == "0.0.0.0"
    host, port = env["NEXUS_OPENAI_ROUTER_ADDR"].split(":")
    assert host == "router" and int(port) == DEFAULT_PORTS["router"]
    assert front["depends_on"] == {"router": {"condition": "service_healthy"}}
    # the engine is not a compose service: the front reaches the host's
    host, port = env["NEXUS_OPENAI_ENGINE_ADDR"].split(":")
    assert host == "host.docker.internal" and int(port) == DEFAULT_PORTS["engine"]
    assert "host.docker.internal:host-gateway" in front["extra_hosts"]
    assert front["ports"] == [f"8000:{DEFAULT_PORTS['openai']}"]
    test = front["healthcheck"]["test"]
    assert test[:3] == ["CMD", "python", "-c"] and f"http://127.0.0.1:{DEFAULT_PORTS['openai']}/health" in test[3]
    # the healthcheck command itself: exit 0 on 200, non-zero on the front's 503 (backends down) or no front
    import http.server
    import subprocess
    import sys
    import threading

    status = {"code": 200}

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self.send_response(status["code"] if self.path == "/health" else 404)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    code = test[3].replace(":8000/", f":{server.server_port}/")
    try:
        assert subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=30).returncode == 0
        status["code"] = 503
        assert subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=30).returncode != 0
    finally:
        server.shutdown()


@pytest.mark.parametrize("precision", ["int8"])
def test_router_mounts_the_trained_gate_model_and_loads_it(compose, tmp_path, precision):
    """The router container gets the host's `make setup` gate model read-only where NEXUS_ROUTER_GATE_MODEL_DIR
    points; a real Router built from the compose env (the mount's host side in place of the container path, a local
    store in place of Redis) loads that model with its tuned query encoder at the configured precision (the shipped
    serving form carries the INT8 graph only; fp32 takes `make train`'s training form)."""
    import asyncio

    from services.common.config import load_config
    from services.common.embedder import Embedder
    from services.common.store import LocalStore
    from services.router.config import RouterConfig
    from services.router.router import Router
    from tests.conftest import TOOLS_DIR
    from training.data import load_registry

    router = interpolate(yaml.safe_load(COMPOSE.read_text()), {**ENV, "NEXUS_QUERY_ENCODER_PRECISION": precision})
    router = router["services"]["router"]
    env = env_dict(router["environment"])
    mounts = {dst: (src, mode) for src, dst, mode in (v.split(":") for v in router["volumes"])}
    src, mode = mounts[env["NEXUS_ROUTER_GATE_MODEL_DIR"]]
    assert mode == "ro" and env["NEXUS_ROUTER_QUERY_ENCODER_PRECISION"] == precision
    host = (DEPLOY / src).resolve()
    assert host == (REPO / "var" / "models" / "gate").resolve()
    if not (host / "gate.json").is_file():
        pytest.fail(f"no gate model at {host}: run `make setup` (it links the shipped one)")
    env.update(NEXUS_ROUTER_GATE_MODEL_DIR=str(host), NEXUS_ROUTER_STORE_URL=str(tmp_path / "store"))
    cfg = load_config(RouterConfig, prefix="NEXUS_ROUTER_", env=env)
    store = LocalStore(cfg.store_url)
    r = Router(cfg, store, Embedder(cfg.embedder_path))
    assert r.gate is not None and r.gate.onnx is not None and r.gate.onnx.precision == precision
    store.registry_put([t for t in load_registry(TOOLS_DIR).tools if t.name in ("get_current_time", "convert_time")])
    asyncio.run(r.sync(force=True))
    assert r.route("what time is it in Tokyo right now?").tool == "get_current_time"
