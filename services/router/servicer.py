"""RouterService gRPC adapter: protobuf in, domain call, protobuf out."""

from __future__ import annotations

import asyncio

from nexus.v1 import router_pb2, router_pb2_grpc
from services.common.clients import AsyncCompilerClient
from services.common.errors import InvalidArgument
from services.common.metrics import Metrics
from services.common.tools import Tool
from services.router.router import HistoryTurn, Router


class RouterServicer(router_pb2_grpc.RouterServiceServicer):
    def __init__(self, router: Router, compiler: AsyncCompilerClient, metrics: Metrics | None = None):
        self.router = router
        self.compiler = compiler
        self.metrics = metrics or Metrics("router")

    async def Route(self, request, context):
        top_k = request.top_k if request.HasField("top_k") else None
        history = [HistoryTurn(role=t.role, content=t.content) for t in request.history]
        decision = await asyncio.to_thread(self.router.route, request.query, history, top_k,
                                           list(request.allowed_tools))
        self.metrics.routes.inc()
        self.metrics.route_ms.observe(decision.route_ms)
        if decision.escalated:
            self.metrics.gate_escalations.inc()
        return router_pb2.RouteResponse(
            tool=decision.tool,
            score=decision.score,
            margin=decision.margin,
            escalated=decision.escalated,
            candidates=[router_pb2.Candidate(tool=n, score=s) for n, s in decision.candidates],
            route_ms=decision.route_ms,
            registry_version=decision.registry_version,
            gate=decision.gate,
        )

    async def RegisterTools(self, request, context):
        warnings: list[str] = []

        async def compile_fn(tool: Tool) -> None:
            res = await self.compiler.compile(tool, derive_requests=self.router.wants_derived(tool),
                                              defer_kv_block=request.defer_kv_blocks)
            warnings.extend(grammar_warnings(res))

        examples: dict[str, list[str]] = {}
        for ex in request.examples:
            if ex.tool in examples:
                raise InvalidArgument(f"examples for {ex.tool!r} given twice")
            examples[ex.tool] = list(ex.requests)
        names, version, total = await self.router.register(list(request.tools), compile_fn, examples)
        return router_pb2.RegisterToolsResponse(names=names, registry_version=version, total=total,
                                                warnings=warnings)

    async def RemoveTools(self, request, context):
        removed, missing, version = await self.router.remove(list(request.names))
        return router_pb2.RemoveToolsResponse(removed=removed, missing=missing, registry_version=version)

    async def ListTools(self, request, context):
        entries, version = self.router.list(request.name_prefix)
        return router_pb2.ListToolsResponse(
            tools=[router_pb2.ToolInfo(name=e.tool.name, description=e.tool.description,
                                       schema_hash=e.tool.schema_hash, signature=e.signature, keys=e.keys)
                   for e in entries],
            registry_version=version,
        )


def grammar_warnings(res) -> list[str]:
    """What registration tells the user about one compiled tool's grammar (a CompileResponse)."""
    if res.grammar_fallback:
        return [f"{res.tool}: its schema does not compile to a grammar; arguments are sampled as any JSON object "
                f"and checked against the schema after sampling"]
    if res.unchecked_keywords:
        return [f"{res.tool}: {', '.join(res.unchecked_keywords)} checked only after sampling (the grammar cannot "
                f"enforce it)"]
    return []
