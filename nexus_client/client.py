"""A thin typed wrapper over the generated stubs: deadlines on every call, retries on UNAVAILABLE
(gRPC retry policy, idempotent calls only), results as dataclasses, errors as ``NexusClientError``
carrying the status code."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc

from nexus.v1 import (
    common_pb2,
    compiler_pb2,
    compiler_pb2_grpc,
    engine_pb2,
    engine_pb2_grpc,
    router_pb2,
    router_pb2_grpc,
)

_RETRY = {
    "methodConfig": [{
        "name": [{"service": "nexus.v1.RouterService", "method": "Route"},
                 {"service": "nexus.v1.RouterService", "method": "ListTools"},
                 {"service": "nexus.v1.CompilerService"}],
        "retryPolicy": {"maxAttempts": 4, "initialBackoff": "0.1s", "maxBackoff": "2s",
                        "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]},
    }]
}
_OPTIONS = [("grpc.enable_retries", 1), ("grpc.service_config", json.dumps(_RETRY)),
            ("grpc.max_receive_message_length", 64 * 1024 * 1024),
            ("grpc.max_send_message_length", 64 * 1024 * 1024)]


class NexusClientError(Exception):
    """A failed call: ``code`` is the ``grpc.StatusCode``, ``details`` the server's message."""

    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(f"{code.name}: {details}")
        self.code, self.details = code, details


@dataclass(frozen=True)
class Candidate:
    tool: str
    score: float


@dataclass(frozen=True)
class RouteResult:
    tool: str
    score: float
    margin: float
    escalated: bool
    candidates: list[Candidate]
    route_ms: float
    registry_version: int
    gate: str = ""


@dataclass(frozen=True)
class GenerateResult:
    tool: str
    arguments: dict
    arguments_json: str
    first_token_ms: float
    first_arg_token_ms: float
    total_ms: float
    prompt_tokens: int
    completion_tokens: int
    path: str
    path_reason: str
    schema_valid: bool
    spliced_tokens: int = 0
    recomputed_tokens: int = 0
    recompute_fraction: float | None = None
    text: str = ""  # a text answer (``generate`` with tool ""): the model's reply
    truncated: bool = False  # the text answer stopped at max_tokens


@dataclass(frozen=True)
class CompileResult:
    tool: str
    schema_hash: str
    signature: str
    signature_tokens: int
    artifacts: dict[str, str]  # kind name -> artifact id
    cached: bool


def _turns(history: Sequence[dict]) -> list[common_pb2.Turn]:
    return [common_pb2.Turn(role=str(t.get("role", "")), content=str(t.get("content", ""))) for t in history]


def tls_credentials(ca: str | os.PathLike[str] | bytes | None = None, cert: str | os.PathLike[str] | None = None,
                    key: str | os.PathLike[str] | None = None) -> grpc.ChannelCredentials:
    """TLS channel credentials from PEM files: ``ca`` to trust (a path or the PEM bytes; None = system roots),
    ``cert`` + ``key`` for mutual TLS."""
    def read(p):
        return None if p is None else (p if isinstance(p, bytes) else Path(p).read_bytes())

    return grpc.ssl_channel_credentials(root_certificates=read(ca), private_key=read(key),
                                        certificate_chain=read(cert))


class NexusClient:
    """Client of the three services; ``timeout_s`` is the default per-call deadline.

    ``credentials`` (e.g. ``tls_credentials("ca.pem")``) connects over TLS; ``token`` is sent as
    ``authorization: Bearer <token>`` on every call (servers with ``auth_token`` set require it)."""

    def __init__(self, router: str = "127.0.0.1:50051", engine: str = "127.0.0.1:50053",
                 compiler: str = "127.0.0.1:50052", timeout_s: float = 120.0,
                 credentials: grpc.ChannelCredentials | None = None, token: str | None = None):
        self.timeout_s = timeout_s
        self._metadata = (("authorization", f"Bearer {token}"),) if token else None

        def channel(addr: str) -> grpc.Channel:
            if credentials is not None:
                return grpc.secure_channel(addr, credentials, options=_OPTIONS)
            return grpc.insecure_channel(addr, options=_OPTIONS)

        self._channels = [channel(router), channel(engine), channel(compiler)]
        self.router = router_pb2_grpc.RouterServiceStub(self._channels[0])
        self.engine = engine_pb2_grpc.EngineServiceStub(self._channels[1])
        self.compiler = compiler_pb2_grpc.CompilerServiceStub(self._channels[2])

    def _call(self, fn, request, timeout_s: float | None):
        try:
            return fn(request, timeout=timeout_s or self.timeout_s, metadata=self._metadata)
        except grpc.RpcError as e:
            raise NexusClientError(e.code(), e.details() or "") from e

    # -- router -------------------------------------------------------------------------------
    def route_pb(self, query: str, history: Sequence[dict] = (), top_k: int | None = None,
                 timeout_s: float | None = None, *, allowed_tools: Sequence[str] = ()) -> router_pb2.RouteResponse:
        """``allowed_tools``: route among these registered names only (empty: every registered tool); a name that
        is not registered is NOT_FOUND."""
        req = router_pb2.RouteRequest(query=query, history=_turns(history), top_k=top_k,
                                      allowed_tools=list(allowed_tools))
        return self._call(self.router.Route, req, timeout_s)

    def route(self, query: str, history: Sequence[dict] = (), top_k: int | None = None,
              timeout_s: float | None = None, *, allowed_tools: Sequence[str] = ()) -> RouteResult:
        r = self.route_pb(query, history, top_k, timeout_s, allowed_tools=allowed_tools)
        return RouteResult(r.tool, r.score, r.margin, r.escalated, [Candidate(c.tool, c.score) for c in r.candidates],
                           r.route_ms, r.registry_version, r.gate)

    def register(self, tools: Sequence[dict | str], timeout_s: float | None = None, *,
                 defer_kv_blocks: bool = False,
                 examples: Mapping[str, Sequence[str]] | None = None) -> router_pb2.RegisterToolsResponse:
        """``defer_kv_blocks``: return once the tools route and generate; their KV blocks compile in the background
        (the engine prefills a tool's signature as text until its block is stored). ``examples``: tool name ->
        requests a user would send for it (tools of this call): the router keys the tool by them too."""
        raw = [t if isinstance(t, str) else json.dumps(t) for t in tools]
        ex = [router_pb2.ToolExamples(tool=n, requests=list(r)) for n, r in (examples or {}).items()]
        return self._call(self.router.RegisterTools,
                          router_pb2.RegisterToolsRequest(tools=raw, defer_kv_blocks=defer_kv_blocks, examples=ex),
                          timeout_s or max(self.timeout_s, 600.0))

    def remove(self, names: Sequence[str], timeout_s: float | None = None) -> router_pb2.RemoveToolsResponse:
        return self._call(self.router.RemoveTools, router_pb2.RemoveToolsRequest(names=list(names)), timeout_s)

    def list_tools(self, prefix: str = "", timeout_s: float | None = None) -> router_pb2.ListToolsResponse:
        return self._call(self.router.ListTools, router_pb2.ListToolsRequest(name_prefix=prefix), timeout_s)

    # -- engine -------------------------------------------------------------------------------
    def generate_stream(self, query: str, tool: str, history: Sequence[dict] = (), max_tokens: int | None = None,
                        timeout_s: float | None = None, *, prefill: str = "", fidelity: str = "",
                        validate: bool | None = None, result_only: bool = False
                        ) -> Iterator[engine_pb2.GenerateResponse]:
        """``prefill``: "" (engine's choice), "splice" (required) or "text"; ``fidelity``: "" / "adaptive" /
        "exact"; ``validate``: check a splice against a text prefill (None: the engine's sampling rate);
        ``result_only``: the final result alone, no token pieces."""
        req = engine_pb2.GenerateRequest(
            query=query, tool=tool, history=_turns(history), max_tokens=max_tokens, validate=validate,
            result_only=result_only,
            prefill=engine_pb2.PrefillPath.Value(f"PREFILL_PATH_{prefill.upper()}") if prefill else 0,
            fidelity=engine_pb2.Fidelity.Value(f"FIDELITY_{fidelity.upper()}") if fidelity else 0)
        try:
            yield from self.engine.Generate(req, timeout=timeout_s or self.timeout_s, metadata=self._metadata)
        except grpc.RpcError as e:
            raise NexusClientError(e.code(), e.details() or "") from e

    def generate(self, query: str, tool: str, history: Sequence[dict] = (), max_tokens: int | None = None,
                 timeout_s: float | None = None, **options) -> GenerateResult:
        """``options``: ``prefill``, ``fidelity``, ``validate`` as for ``generate_stream``. ``tool`` "": a text
        answer to the conversation (``GenerateResult.text``), no tool."""
        final = None
        for msg in self.generate_stream(query, tool, history, max_tokens, timeout_s, result_only=True, **options):
            if msg.HasField("result"):
                final = msg.result
        if final is None:
            raise NexusClientError(grpc.StatusCode.UNKNOWN, "stream ended without a result")
        try:
            args = json.loads(final.arguments_json)
        except ValueError:
            args = {}
        return GenerateResult(
            final.tool, args, final.arguments_json, final.timings.first_token_ms, final.timings.first_arg_token_ms,
            final.timings.total_ms, final.prompt_tokens, final.completion_tokens,
            engine_pb2.PrefillPath.Name(final.path), final.path_reason, final.schema_valid,
            final.spliced_tokens, final.recomputed_tokens,
            final.recompute_fraction if final.HasField("recompute_fraction") else None,
            final.text, final.truncated,
        )

    # -- compiler -----------------------------------------------------------------------------
    def compile(self, tool: dict | str, timeout_s: float | None = None) -> CompileResult:
        raw = tool if isinstance(tool, str) else json.dumps(tool)
        r = self._call(self.compiler.Compile, compiler_pb2.CompileRequest(tool=raw), timeout_s)
        return CompileResult(r.tool, r.schema_hash, r.signature, r.signature_tokens,
                             {compiler_pb2.ArtifactKind.Name(a.kind): a.id for a in r.artifacts}, r.cached)

    def get_artifact(self, artifact_id: str, timeout_s: float | None = None) -> bytes:
        return self._call(self.compiler.GetArtifact, compiler_pb2.GetArtifactRequest(id=artifact_id), timeout_s).data

    def close(self) -> None:
        for c in self._channels:
            c.close()

    def __enter__(self) -> NexusClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
