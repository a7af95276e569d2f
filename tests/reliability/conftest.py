"""Fixtures for the reliability tests: a throw-away CA with server and client certificates, and
redis-server processes this package controls (stopped, restarted, password-protected)."""

from __future__ import annotations

import datetime
import ipaddress
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import free_port


def _name(cn: str):
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _cert(subject: str, key, issuer_name, issuer_key, *, ca: bool, san: bool):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes

    now = datetime.datetime.now(datetime.UTC)
    b = (x509.CertificateBuilder().subject_name(_name(subject)).issuer_name(issuer_name)
         .public_key(key.public_key()).serial_number(x509.random_serial_number())
         .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
         .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if san:
        b = b.add_extension(x509.SubjectAlternativeName(
            [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
    return b.sign(issuer_key, hashes.SHA256())


@pytest.fixture(scope="session")
def certs(tmp_path_factory) -> dict[str, Path]:
    """A self-signed CA, a server certificate for 127.0.0.1 / localhost and a client certificate, as PEM files;
    plus a second, unrelated CA (``other_ca``) that must not be trusted."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    d = tmp_path_factory.mktemp("certs")
    out: dict[str, Path] = {}

    def write(name: str, cert=None, key=None) -> None:
        if cert is not None:
            out[name] = d / f"{name}.pem"
            out[name].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        if key is not None:
            out[f"{name}_key"] = d / f"{name}.key"
            out[f"{name}_key"].write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                             serialization.PrivateFormat.PKCS8,
                                                             serialization.NoEncryption()))

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _cert("nexus test CA", ca_key, _name("nexus test CA"), ca_key, ca=True, san=False)
    write("ca", ca)
    for name in ("server", "client"):
        key = ec.generate_private_key(ec.SECP256R1())
        write(name, _cert(f"nexus {name}", key, ca.subject, ca_key, ca=False, san=True), key)
    other_key = ec.generate_private_key(ec.SECP256R1())
    write("other_ca", _cert("other CA", other_key, _name("other CA"), other_key, ca=True, san=False))
    return out


class RedisProcess:
    """A redis-server on a fixed port and data directory that a test can stop and start again
    (append-only file on, so the data survives a restart)."""

    def __init__(self, data_dir: Path, password: str | None = None):
        self.exe = shutil.which("redis-server")
        if self.exe is None:
            pytest.fail("redis-server is not installed")
        self.port, self.dir, self.password = free_port(), data_dir, password
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self) -> RedisProcess:
        args = [self.exe, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir),
                "--appendonly", "yes", "--appendfsync", "always", "--save", ""]
        if self.password:
            args += ["--requirepass", self.password]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        import redis

        r = redis.Redis(host="127.0.0.1", port=self.port, password=self.password)
        deadline = time.monotonic() + 20
        while True:
            try:
                r.ping()
                return self
            except redis.exceptions.ConnectionError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    self.stop()
                    pytest.fail("redis-server did not start")
                time.sleep(0.05)

    def stop(self, kill: bool = False) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill() if kill else self.proc.terminate()
            self.proc.wait(timeout=20)
        self.proc = None


@pytest.fixture
def redis_proc(tmp_path):
    r = RedisProcess(tmp_path / "redis")
    r.dir.mkdir()
    yield r.start()
    r.stop()


@pytest.fixture(scope="session")
def rc_cluster(tmp_path_factory, small_tools):
    """Compiler and router (no engine) on their own directory store, the small registry registered:
    what the router / compiler bad-input and fault tests need, without loading the LLM."""
    from services.common.clients import NexusClient
    from tests.conftest import start_compiler, start_router

    store_url = str(tmp_path_factory.mktemp("rc-store"))
    compiler = start_compiler(store_url)
    router = start_router(store_url, compiler.addr)
    client = NexusClient(router=router.addr, compiler=compiler.addr, timeout_s=120)
    client.register([t.to_json() for t in small_tools])
    yield {"router": router, "compiler": compiler, "client": client, "store_url": store_url}
    client.close()
    router.stop()
    compiler.stop()
