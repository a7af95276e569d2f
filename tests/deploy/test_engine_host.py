"""deploy/engine: the engine runs natively under systemd. The unit is checked by systemd's own
`systemd-analyze verify` (when present) and by parsing it; install.sh is run into a scratch root."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from tests.deploy.checks import DEPLOY, config_problems

ENGINE = DEPLOY / "engine"
UNIT = ENGINE / "nexus-engine.service"


def parse_unit(text: str) -> dict[str, dict[str, list[str]]]:
    """systemd unit -> {section: {key: [values in order]}} (keys may repeat)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        key, _, value = line.partition("=")
        assert current is not None, f"key outside a section: {line}"
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


@pytest.fixture(scope="module")
def unit() -> dict[str, dict[str, list[str]]]:
    return parse_unit(UNIT.read_text())


def test_unit_runs_the_engine_as_an_unprivileged_user(unit):
    svc = unit["Service"]
    assert svc["ExecStart"] == ["/opt/nexus/.venv/bin/nexus serve engine"]
    assert svc["User"] == ["nexus"] and svc["Group"] == ["nexus"]
    assert svc["EnvironmentFile"] == ["/etc/nexus/engine.env"]
    assert "HF_HUB_OFFLINE=1" in svc["Environment"][0]
    assert svc["KillSignal"] == ["SIGTERM"]
    # Stop timeout above the engine's own grace period, so SIGKILL never cuts a graceful stop short.
    from services.engine.config import EngineConfig

    assert float(svc["TimeoutStopSec"][0]) > EngineConfig().grace_s
    assert svc["Restart"] == ["on-failure"]
    assert unit["Install"]["WantedBy"] == ["multi-user.target"]


def test_unit_is_hardened(unit):
    svc = {k: v[-1] for k, v in unit["Service"].items()}
    expected = {"NoNewPrivileges": "yes", "ProtectSystem": "strict", "ProtectHome": "yes", "PrivateTmp": "yes",
                "PrivateDevices": "yes", "ProtectKernelTunables": "yes", "ProtectKernelModules": "yes",
                "ProtectControlGroups": "yes", "RestrictNamespaces": "yes", "RestrictSUIDSGID": "yes",
                "LockPersonality": "yes", "CapabilityBoundingSet": "", "SystemCallArchitectures": "native"}
    assert {k: svc.get(k) for k in expected} == expected
    assert unit["Service"]["SystemCallFilter"][0] == "@system-service"
    assert unit["Service"]["SystemCallFilter"][1].startswith("~@privileged")
    assert svc["RestrictAddressFamilies"].split() == ["AF_INET", "AF_INET6", "AF_UNIX"]
    # ProtectSystem=strict makes / read-only: the engine's only writable place is its StateDirectory.
    assert svc["StateDirectory"] == "nexus-engine" and svc["WorkingDirectory"] == "/var/lib/nexus-engine"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_systemd_analyze_verify_is_clean(tmp_path):
    # verify checks that ExecStart exists; point it at a real executable, keep everything else.
    text = UNIT.read_text().replace("ExecStart=/opt/nexus/.venv/bin/nexus", f"ExecStart={sys.executable}")
    (tmp_path / "nexus-engine.service").write_text(text)
    out = subprocess.run(["systemd-analyze", "verify", str(tmp_path / "nexus-engine.service")],
                         capture_output=True, text=True, timeout=60)
    # verify exits 0 on unknown keys / bad values and only warns: any output is a finding.
    assert out.returncode == 0 and out.stdout.strip() == "" and out.stderr.strip() == "", out.stderr


def read_env_file(path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if line and not line.startswith("#"))


def test_env_example_is_valid_engine_config():
    env = read_env_file(ENGINE / "nexus-engine.env.example")
    assert set(env) >= {"NEXUS_ENGINE_HOST", "NEXUS_ENGINE_PORT", "NEXUS_ENGINE_STORE_URL"}
    assert all(k.startswith("NEXUS_ENGINE_") for k in env)
    assert config_problems(env, "nexus-engine.env.example") == []
    assert env["NEXUS_ENGINE_HOST"] == "0.0.0.0" and env["NEXUS_ENGINE_PORT"] == "50053"


def test_install_script_installs_into_a_root(tmp_path):
    root = tmp_path / "root"
    run = lambda: subprocess.run(["bash", str(ENGINE / "install.sh"), "--root", str(root), "--prefix", "/srv/nexus"],  # noqa: E731
                                 capture_output=True, text=True, timeout=60)
    out = run()
    assert out.returncode == 0, out.stderr
    installed = parse_unit((root / "etc/systemd/system/nexus-engine.service").read_text())
    assert installed["Service"]["ExecStart"] == ["/srv/nexus/.venv/bin/nexus serve engine"]
    env = root / "etc/nexus/engine.env"
    assert env.read_text() == (ENGINE / "nexus-engine.env.example").read_text()
    env.write_text("NEXUS_ENGINE_PORT=6000\n")
    assert run().returncode == 0
    assert env.read_text() == "NEXUS_ENGINE_PORT=6000\n"  # an operator's env file is never overwritten
    bad = subprocess.run(["bash", str(ENGINE / "install.sh"), "--bogus"], capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown argument" in bad.stderr
