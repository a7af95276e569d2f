"""gRPC clients for the Nexus services.

Service-to-service calls use the async clients here, whose errors come back as ``NexusError``
subclasses (``from_rpc_error``). Users, the CLI and tests use the typed synchronous
``nexus_client.NexusClient`` (re-exported here), which ships as its own wheel (``make stubs``)."""

from __future__ import annotations

import grpc

from nexus.v1 import compiler_pb2, compiler_pb2_grpc
from nexus_client import NexusClient, NexusClientError
from services.common.errors import from_rpc_error
from services.common.security import ClientSecurity
from services.common.tools import Tool

DEFAULT_OPTIONS = [("grpc.max_receive_message_length", 64 * 1024 * 1024),
                   ("grpc.max_send_message_length", 64 * 1024 * 1024)]


class AsyncCompilerClient:
    """The router's client of the compiler; ``security`` adds TLS and / or a bearer token
    (``ClientSecurity.for_compiler(router_config)``)."""

    def __init__(self, addr: str, timeout_s: float = 60.0, security: ClientSecurity | None = None):
        self.addr = addr
        self.timeout_s = timeout_s
        security = security or ClientSecurity()
        creds = security.credentials()
        self._metadata = security.metadata() or None
        self._channel = (grpc.aio.secure_channel(addr, creds, options=DEFAULT_OPTIONS) if creds is not None
                         else grpc.aio.insecure_channel(addr, options=DEFAULT_OPTIONS))
        self._stub = compiler_pb2_grpc.CompilerServiceStub(self._channel)

    async def compile(self, tool: Tool, derive_requests: bool = False,
                      defer_kv_block: bool = False) -> compiler_pb2.CompileResponse:
        try:
            return await self._stub.Compile(compiler_pb2.CompileRequest(tool=tool.to_json(),
                                                                        derive_requests=derive_requests,
                                                                        defer_kv_block=defer_kv_block),
                                            timeout=self.timeout_s, wait_for_ready=True, metadata=self._metadata)
        except grpc.aio.AioRpcError as e:
            raise from_rpc_error(e) from e

    async def close(self) -> None:
        await self._channel.close()


__all__ = ["AsyncCompilerClient", "ClientSecurity", "NexusClient", "NexusClientError"]
