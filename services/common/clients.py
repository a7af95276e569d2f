"""gRPC clients for the Nexus services (async for service-to-service calls, sync for the CLI).

Errors come back as ``NexusError`` subclasses (``from_rpc_error``), so callers handle one hierarchy."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence

import grpc

from nexus.v1 import compiler_pb2, compiler_pb2_grpc, engine_pb2, engine_pb2_grpc, router_pb2, router_pb2_grpc
from services.common.convert import turns_to_pb
from services.common.errors import from_rpc_error
from services.common.tools import Tool

DEFAULT_OPTIONS = [("grpc.max_receive_message_length", 64 * 1024 * 1024),
                   ("grpc.max_send_message_length", 64 * 1024 * 1024)]


class AsyncCompilerClient:
    def __init__(self, addr: str, timeout_s: float = 60.0):
        self.addr = addr
        self.timeout_s = timeout_s
        self._channel = grpc.aio.insecure_channel(addr, options=DEFAULT_OPTIONS)
        self._stub = compiler_pb2_grpc.CompilerServiceStub(self._channel)

    async def compile(self, tool: Tool) -> compiler_pb2.CompileResponse:
        try:
            return await self._stub.Compile(compiler_pb2.CompileRequest(tool=tool.to_json()), timeout=self.timeout_s,
                                            wait_for_ready=True)
        except grpc.aio.AioRpcError as e:
            raise from_rpc_error(e) from e

    async def close(self) -> None:
        await self._channel.close()


class NexusClient:
    """Synchronous client of a Nexus cluster (router, compiler, engine), with per-call deadlines."""

    def __init__(self, router: str = "127.0.0.1:50051", engine: str = "127.0.0.1:50053",
                 compiler: str = "127.0.0.1:50052", timeout_s: float = 120.0):
        self.timeout_s = timeout_s
        self._channels = [grpc.insecure_channel(a, options=DEFAULT_OPTIONS) for a in (router, engine, compiler)]
        self.router = router_pb2_grpc.RouterServiceStub(self._channels[0])
        self.engine = engine_pb2_grpc.EngineServiceStub(self._channels[1])
        self.compiler = compiler_pb2_grpc.CompilerServiceStub(self._channels[2])

    def route(self, query: str, history: Sequence[dict] = (), top_k: int | None = None) -> router_pb2.RouteResponse:
        try:
            return self.router.Route(router_pb2.RouteRequest(query=query, history=turns_to_pb(history), top_k=top_k),
                                     timeout=self.timeout_s)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from e

    def register(self, tools: Sequence[dict | str]) -> router_pb2.RegisterToolsResponse:
        raw = [t if isinstance(t, str) else json.dumps(t) for t in tools]
        try:
            return self.router.RegisterTools(router_pb2.RegisterToolsRequest(tools=raw), timeout=max(self.timeout_s, 600))
        except grpc.RpcError as e:
            raise from_rpc_error(e) from e

    def list_tools(self, prefix: str = "") -> router_pb2.ListToolsResponse:
        try:
            return self.router.ListTools(router_pb2.ListToolsRequest(name_prefix=prefix), timeout=self.timeout_s)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from e

    def generate_stream(self, query: str, tool: str, history: Sequence[dict] = (),
                        max_tokens: int | None = None) -> Iterator[engine_pb2.GenerateResponse]:
        req = engine_pb2.GenerateRequest(query=query, tool=tool, history=turns_to_pb(history), max_tokens=max_tokens)
        try:
            yield from self.engine.Generate(req, timeout=self.timeout_s)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from e

    def generate(self, query: str, tool: str, history: Sequence[dict] = ()) -> engine_pb2.GenerateResult:
        result = None
        for msg in self.generate_stream(query, tool, history):
            if msg.HasField("result"):
                result = msg.result
        if result is None:
            raise RuntimeError("engine stream ended without a result")
        return result

    def close(self) -> None:
        for c in self._channels:
            c.close()

    def __enter__(self) -> NexusClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
