"""The front's asynchronous clients of the router and the engine (grpc.aio over the generated ``nexus.v1`` stubs).

Errors come back as ``NexusError`` subclasses (``from_rpc_error``), as ``AsyncCompilerClient`` does for the
router. Kept here, beside their only user, until a second asynchronous caller wants them in
services/common/clients.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from nexus.v1 import common_pb2, engine_pb2, engine_pb2_grpc, router_pb2, router_pb2_grpc
from services.common.clients import DEFAULT_OPTIONS
from services.common.errors import NexusError, Unavailable, from_rpc_error
from services.common.security import ClientSecurity
from services.openai.config import OpenAIConfig

ROUTER_SERVICE = "nexus.v1.RouterService"
ENGINE_SERVICE = "nexus.v1.EngineService"


@dataclass(frozen=True)
class RegisteredTool:
    name: str
    schema_hash: str


@dataclass(frozen=True)
class Registry:
    tools: tuple[RegisteredTool, ...]
    version: int


@dataclass(frozen=True)
class Routed:
    tool: str
    score: float
    margin: float
    gate: str
    candidates: tuple[tuple[str, float], ...]
    route_ms: float
    registry_version: int


@dataclass(frozen=True)
class Generated:
    """The engine's final summary of a call."""

    arguments_json: str
    prompt_tokens: int
    completion_tokens: int
    spliced_tokens: int
    recomputed_tokens: int
    path: str
    path_reason: str
    schema_valid: bool
    first_token_ms: float
    total_ms: float
    # a text answer (no tool): the text, and whether it stopped at max_tokens
    text: str = ""
    truncated: bool = False


def _error(e: grpc.aio.AioRpcError, service: str) -> NexusError:
    """The service's error as a ``NexusError``. The front's own credentials refused by the service is the
    operator's misconfiguration, not the HTTP caller's: Unavailable (503), never the caller's 401."""
    if e.code() == grpc.StatusCode.UNAUTHENTICATED:
        return Unavailable(f"the {service} refused the front's credentials (backend_auth_token): {e.details()}")
    return from_rpc_error(e)


def _turns(history: Sequence[tuple[str, str]]) -> list[common_pb2.Turn]:
    return [common_pb2.Turn(role=r, content=c) for r, c in history]


def security_of(config: OpenAIConfig) -> ClientSecurity:
    return ClientSecurity(tls_ca=config.backend_tls_ca, tls_cert=config.backend_tls_cert,
                          tls_key=config.backend_tls_key, token=config.backend_auth_token,
                          token_file=config.backend_auth_token_file)


class Backend:
    """Router + engine channels for one front. Create inside the running event loop; ``close`` when done."""

    def __init__(self, config: OpenAIConfig):
        self.config = config
        security = security_of(config)
        creds = security.credentials()
        self._metadata = security.metadata() or None

        def channel(addr: str) -> grpc.aio.Channel:
            return (grpc.aio.secure_channel(addr, creds, options=DEFAULT_OPTIONS) if creds is not None
                    else grpc.aio.insecure_channel(addr, options=DEFAULT_OPTIONS))

        self._router_ch, self._engine_ch = channel(config.router_addr), channel(config.engine_addr)
        self.router = router_pb2_grpc.RouterServiceStub(self._router_ch)
        self.engine = engine_pb2_grpc.EngineServiceStub(self._engine_ch)
        self._health = {ROUTER_SERVICE: health_pb2_grpc.HealthStub(self._router_ch),
                        ENGINE_SERVICE: health_pb2_grpc.HealthStub(self._engine_ch)}

    async def close(self) -> None:
        await asyncio.gather(self._router_ch.close(), self._engine_ch.close())

    # -- health -------------------------------------------------------------------------------------------
    async def health(self, timeout_s: float = 2.0, wait: bool = False) -> dict[str, str]:
        """Each service's health status name (SERVING, NOT_SERVING, or UNAVAILABLE when unreachable).
        ``wait``: wait up to ``timeout_s`` for a channel to connect rather than failing fast."""

        async def one(service: str, stub) -> str:
            try:
                r = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout_s,
                                     wait_for_ready=wait)
                return health_pb2.HealthCheckResponse.ServingStatus.Name(r.status)
            except grpc.aio.AioRpcError as e:
                return e.code().name

        names = list(self._health)
        got = await asyncio.gather(*(one(n, self._health[n]) for n in names))
        return {"router" if n == ROUTER_SERVICE else "engine": s for n, s in zip(names, got, strict=True)}

    async def wait_serving(self, timeout_s: float) -> bool:
        """Until both report SERVING (True) or ``timeout_s`` passes (False). Start-up only. It asks Check again
        every 0.2 s while a service is up but still warming (NOT_SERVING): Health.Watch would avoid that, but the
        services' ErrorInterceptor breaks it (it iterates the servicer's coroutine-style stream handler)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            left = deadline - loop.time()
            if left <= 0:
                return False
            status = await self.health(timeout_s=left, wait=True)
            if all(v == "SERVING" for v in status.values()):
                return True
            await asyncio.sleep(min(0.2, max(0.0, deadline - loop.time())))

    # -- router -------------------------------------------------------------------------------------------
    async def list_tools(self) -> Registry:
        try:
            r = await self.router.ListTools(router_pb2.ListToolsRequest(), timeout=self.config.route_timeout_s,
                                            metadata=self._metadata)
        except grpc.aio.AioRpcError as e:
            raise _error(e, "router") from e
        return Registry(tuple(RegisteredTool(t.name, t.schema_hash) for t in r.tools), r.registry_version)

    async def register(self, tools_json: Sequence[str]) -> tuple[list[str], int, int]:
        try:
            # the request waits for what routing and generation need; the KV blocks compile in the background
            r = await self.router.RegisterTools(router_pb2.RegisterToolsRequest(tools=list(tools_json),
                                                                                defer_kv_blocks=True),
                                                timeout=self.config.register_timeout_s, metadata=self._metadata)
        except grpc.aio.AioRpcError as e:
            raise _error(e, "router") from e
        return list(r.names), r.registry_version, r.total

    async def route(self, query: str, history: Sequence[tuple[str, str]], allowed: Sequence[str],
                    top_k: int = 1) -> Routed:
        """Route among the registered names ``allowed`` only (NotFound when one is not registered)."""
        req = router_pb2.RouteRequest(query=query, history=_turns(history), top_k=top_k, allowed_tools=list(allowed))
        try:
            r = await self.router.Route(req, timeout=self.config.route_timeout_s, metadata=self._metadata)
        except grpc.aio.AioRpcError as e:
            raise _error(e, "router") from e
        return Routed(r.tool, r.score, r.margin, r.gate, tuple((c.tool, c.score) for c in r.candidates),
                      r.route_ms, r.registry_version)

    # -- engine -------------------------------------------------------------------------------------------
    async def generate(self, query: str, tool: str, history: Sequence[tuple[str, str]],
                       max_tokens: int | None, pieces: bool = True) -> AsyncIterator[str | Generated]:
        """The argument text in pieces as sampled, then one ``Generated``; ``tool`` empty: a text answer to the
        conversation (``history`` then ``query``), in pieces, then ``Generated`` with its ``text``. ``pieces``
        False: the ``Generated`` alone (the engine sends no token message). Cancelling the iteration cancels the
        call (the engine then stops sampling)."""
        call = self.engine.Generate(
            engine_pb2.GenerateRequest(query=query, tool=tool, history=_turns(history), max_tokens=max_tokens,
                                       result_only=not pieces),
            timeout=self.config.generate_timeout_s, metadata=self._metadata)
        done = False
        try:
            async for msg in call:
                if msg.HasField("result"):
                    r = msg.result
                    done = True
                    yield Generated(r.arguments_json, r.prompt_tokens, r.completion_tokens, r.spliced_tokens,
                                    r.recomputed_tokens, engine_pb2.PrefillPath.Name(r.path).removeprefix(
                                        "PREFILL_PATH_").lower(), r.path_reason, r.schema_valid,
                                    r.timings.first_token_ms, r.timings.total_ms, r.text, r.truncated)
                else:
                    yield msg.token
        except grpc.aio.AioRpcError as e:
            raise _error(e, "engine") from e
        finally:
            call.cancel()
        if not done:
            raise Unavailable("the engine's stream ended without a result")


__all__ = ["Backend", "Generated", "NexusError", "RegisteredTool", "Registry", "Routed"]
