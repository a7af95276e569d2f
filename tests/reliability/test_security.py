"""Transport security against real servers: TLS with a certificate made here, mTLS, the bearer-token
interceptor (UNAUTHENTICATED, health left open), Redis with a password, and the no-pickle/no-eval rule
for stored data."""

from __future__ import annotations

import json
import re
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from nexus_client import NexusClient, NexusClientError, tls_credentials
from services.common.config import ConfigError, load_config
from services.common.errors import DataCorruption, Unauthenticated, Unavailable
from services.common.security import ClientSecurity, ServerSecurity
from services.common.server import serve
from tests.conftest import REPO, ServerThread
from tests.reliability.conftest import RedisProcess

pytestmark = pytest.mark.integration

TOKEN = "s3cret-token-for-tests"
TOOL = {"name": "echo_text", "description": "Echo a text back",
        "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}


def start_compiler(tmp_path: Path, **security) -> ServerThread:
    from services.compiler.config import CompilerConfig
    from services.compiler.server import run

    cfg = CompilerConfig(port=0, store_url=str(tmp_path / "store"), grace_s=0.5, metrics_port=0, **security)
    return ServerThread(run, cfg).start()


@pytest.fixture(scope="module")
def tls_compiler(tmp_path_factory, certs):
    """A real compiler served over TLS with a token (from a file)."""
    d = tmp_path_factory.mktemp("tls-compiler")
    (d / "token").write_text(TOKEN + "\n")
    server = start_compiler(d, tls_cert=str(certs["server"]), tls_key=str(certs["server_key"]),
                            auth_token_file=str(d / "token"))
    yield server
    server.stop()


def health(channel: grpc.Channel) -> int:
    return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10).status


def test_tls_and_token_let_a_client_in(tls_compiler, certs):
    with NexusClient(compiler=tls_compiler.addr, credentials=tls_credentials(certs["ca"]), token=TOKEN,
                     timeout_s=60) as c:
        res = c.compile(TOOL)
        assert res.tool == "echo_text" and res.signature
        assert c.get_artifact(res.artifacts["ARTIFACT_KIND_SIGNATURE"]).decode() == res.signature


@pytest.mark.parametrize("token", [None, "wrong", TOKEN + "x"])
def test_missing_or_wrong_token_is_unauthenticated(tls_compiler, certs, token):
    with NexusClient(compiler=tls_compiler.addr, credentials=tls_credentials(certs["ca"]), token=token,
                     timeout_s=10) as c:
        with pytest.raises(NexusClientError) as ei:
            c.compile(TOOL)
        assert ei.value.code == grpc.StatusCode.UNAUTHENTICATED
        assert "bearer token" in ei.value.details


def test_non_bearer_scheme_is_refused(tls_compiler, certs):
    from nexus.v1 import compiler_pb2, compiler_pb2_grpc

    with grpc.secure_channel(tls_compiler.addr, tls_credentials(certs["ca"])) as ch:
        stub = compiler_pb2_grpc.CompilerServiceStub(ch)
        with pytest.raises(grpc.RpcError) as ei:
            stub.GetArtifact(compiler_pb2.GetArtifactRequest(id="x"), timeout=10,
                             metadata=(("authorization", f"Basic {TOKEN}"),))
        assert ei.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_health_is_open_but_reflection_needs_the_token(tls_compiler, certs):
    with grpc.secure_channel(tls_compiler.addr, tls_credentials(certs["ca"])) as ch:
        # Health carries no data and probes (k8s, load balancers) hold no secret: left open by design.
        assert health(ch) == health_pb2.HealthCheckResponse.SERVING
        refl = reflection_pb2_grpc.ServerReflectionStub(ch)
        req = reflection_pb2.ServerReflectionRequest(list_services="")
        with pytest.raises(grpc.RpcError) as ei:
            list(refl.ServerReflectionInfo(iter([req]), timeout=10))
        assert ei.value.code() == grpc.StatusCode.UNAUTHENTICATED
        out = list(refl.ServerReflectionInfo(iter([req]), timeout=10,
                                             metadata=(("authorization", f"Bearer {TOKEN}"),)))
        names = {s.name for s in out[0].list_services_response.service}
        assert "nexus.v1.CompilerService" in names


def test_plaintext_or_untrusted_ca_cannot_connect(tls_compiler, certs):
    for ch in (grpc.insecure_channel(tls_compiler.addr),
               grpc.secure_channel(tls_compiler.addr, tls_credentials(certs["other_ca"]))):
        with ch, pytest.raises(grpc.RpcError) as ei:
            health(ch)
        assert ei.value.code() == grpc.StatusCode.UNAVAILABLE


def test_router_compiler_client_passes_tls_and_token(tls_compiler, certs):
    import asyncio

    from services.common.clients import AsyncCompilerClient
    from services.common.tools import parse_tool

    tool = parse_tool(json.dumps(TOOL))

    async def go(security: ClientSecurity):
        client = AsyncCompilerClient(tls_compiler.addr, timeout_s=30, security=security)
        try:
            return await client.compile(tool)
        finally:
            await client.close()

    assert asyncio.run(go(ClientSecurity(tls_ca=str(certs["ca"]), token=TOKEN))).tool == "echo_text"
    with pytest.raises(Unauthenticated):
        asyncio.run(go(ClientSecurity(tls_ca=str(certs["ca"]))))


def test_cli_flags_build_tls_credentials_and_token(certs, tmp_path):
    from cli.main import build_parser, client_security

    (tmp_path / "tok").write_text(TOKEN)
    args = build_parser().parse_args(["route", "hello", "--tls-ca", str(certs["ca"]), "--token-file",
                                      str(tmp_path / "tok")])
    kw = client_security(args)
    assert isinstance(kw["credentials"], grpc.ChannelCredentials) and kw["token"] == TOKEN


async def _bare_server(config, *, ready=None, stop_event=None):
    """A server with no Nexus service: health + reflection only (enough to test the transport)."""
    await serve([], host="127.0.0.1", port=0, max_message_bytes=1 << 20, grace_s=0.2, ready=ready,
                stop_event=stop_event, security=config)


def test_mutual_tls_requires_a_client_certificate_signed_by_the_ca(certs):
    sec = ServerSecurity(tls_cert=str(certs["server"]), tls_key=str(certs["server_key"]),
                         tls_client_ca=str(certs["ca"]))
    server = ServerThread(_bare_server, sec).start(timeout=30)
    try:
        with grpc.secure_channel(server.addr, tls_credentials(certs["ca"])) as ch, \
                pytest.raises(grpc.RpcError) as ei:
            health(ch)
        assert ei.value.code() == grpc.StatusCode.UNAVAILABLE
        creds = tls_credentials(certs["ca"], cert=certs["client"], key=certs["client_key"])
        with grpc.secure_channel(server.addr, creds) as ch:
            assert health(ch) == health_pb2.HealthCheckResponse.SERVING
    finally:
        server.stop()


def test_security_comes_from_the_service_config_and_env(certs, tmp_path):
    from services.engine.config import EngineConfig
    from services.router.config import RouterConfig

    env = {"NEXUS_ENGINE_TLS_CERT": str(certs["server"]), "NEXUS_ENGINE_TLS_KEY": str(certs["server_key"]),
           "NEXUS_ENGINE_AUTH_TOKEN": TOKEN}
    sec = ServerSecurity.from_config(load_config(EngineConfig, prefix="NEXUS_ENGINE_", env=env))
    assert sec.tls and sec.token() == TOKEN and sec.server_credentials() is not None
    assert len(sec.interceptors()) == 1
    off = ServerSecurity.from_config(RouterConfig())
    assert not off.tls and off.token() is None and off.interceptors() == [] and off.server_credentials() is None
    with pytest.raises(ConfigError, match="together"):
        _ = ServerSecurity(tls_cert=str(certs["server"])).tls
    with pytest.raises(ConfigError, match="either"):
        ServerSecurity(auth_token="a", auth_token_file=str(tmp_path / "t")).token()
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ConfigError, match="empty"):
        ServerSecurity(auth_token_file=str(tmp_path / "empty")).token()
    with pytest.raises(ConfigError, match="cannot read"):
        ServerSecurity(tls_cert=str(tmp_path / "nope.pem"), tls_key=str(tmp_path / "nope.key")).server_credentials()
    rc = load_config(RouterConfig, prefix="NEXUS_ROUTER_", env={"NEXUS_ROUTER_COMPILER_TLS_CA": str(certs["ca"]),
                                                                 "NEXUS_ROUTER_COMPILER_AUTH_TOKEN": TOKEN})
    cs = ClientSecurity.for_compiler(rc)
    assert cs.credentials() is not None and cs.metadata() == (("authorization", f"Bearer {TOKEN}"),)


def test_redis_password(tmp_path):
    from services.common.store import RedisStore

    (tmp_path / "r").mkdir()
    proc = RedisProcess(tmp_path / "r", password="pw-" + "x" * 20).start()
    try:
        good = RedisStore(proc.url)
        info = good.put("sig-abc-def", b"payload", {"k": 1})
        assert good.get_with_info("sig-abc-def") == (b"payload", info)
        for url in (proc.url.replace(proc.password, "wrong"), proc.url.replace(f":{proc.password}@", "")):
            bad = RedisStore(url)
            with pytest.raises(Unavailable) as ei:
                bad.get("sig-abc-def")
            assert proc.password not in ei.value.message
            assert "authentication failed" in ei.value.message or "authenticated" in ei.value.message
            bad.close()
        good.close()
    finally:
        proc.stop()


def test_services_never_unpickle_or_eval_stored_data():
    # A guard: stored envelopes are JSON + bytes; nothing under services/ may deserialise code.
    pattern = re.compile(r"\bpickle\b|\bmarshal\.loads|\bshelve\b|(?<![\w.])eval\(|(?<![\w.])exec\(|yaml\.load\(|"
                         r"\bdill\b|\bcloudpickle\b|torch\.load\(")
    hits = []
    for path in sorted((REPO / "services").rglob("*.py")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if pattern.search(line.split("#", 1)[0]):
                hits.append(f"{path.relative_to(REPO)}:{n}: {line.strip()}")
    assert hits == [], "\n".join(hits)


def test_a_tampered_envelope_is_refused_not_decoded(tmp_path):
    from services.common.store import LocalStore

    store = LocalStore(tmp_path)
    store.put("grammar-aa-bb", b'root ::= "{}"')
    path = tmp_path / "objects" / "grammar-aa-bb"
    blob = bytearray(path.read_bytes())
    # Swap the payload for other bytes of the same length, leaving the header (and its checksum) alone.
    blob[-4:] = b"evil"
    path.write_bytes(bytes(blob))
    with pytest.raises(DataCorruption, match="checksum"):
        store.get("grammar-aa-bb")


def test_router_requires_the_token_when_configured(rc_cluster):
    from tests.conftest import start_router

    router = start_router(rc_cluster["store_url"], rc_cluster["compiler"].addr, auth_token=TOKEN)
    try:
        with NexusClient(router=router.addr, timeout_s=30) as c, pytest.raises(NexusClientError) as ei:
            c.route("what time is it in Tokyo?")
        assert ei.value.code == grpc.StatusCode.UNAUTHENTICATED
        with NexusClient(router=router.addr, timeout_s=30, token=TOKEN) as c:
            assert c.route("what time is it in Tokyo?").tool
    finally:
        router.stop()


def test_engine_serves_tls_and_requires_the_token_when_configured(rc_cluster, certs):
    from tests.conftest import start_engine

    engine = start_engine(rc_cluster["store_url"], auth_token=TOKEN, tls_cert=str(certs["server"]),
                          tls_key=str(certs["server_key"]))
    try:
        creds = tls_credentials(certs["ca"])
        with NexusClient(engine=engine.addr, timeout_s=60, credentials=creds) as c, \
                pytest.raises(NexusClientError) as ei:
            c.generate("what time is it in Tokyo?", "get_current_time", max_tokens=8)
        assert ei.value.code == grpc.StatusCode.UNAUTHENTICATED
        with NexusClient(engine=engine.addr, timeout_s=120, credentials=creds, token=TOKEN) as c:
            assert c.generate("what time is it in Tokyo?", "get_current_time", max_tokens=32).tool == "get_current_time"
    finally:
        engine.stop()
