"""CompilerService gRPC adapter."""

from __future__ import annotations

import asyncio

from nexus.v1 import compiler_pb2, compiler_pb2_grpc
from services.common.errors import InvalidArgument
from services.common.metrics import Metrics
from services.common.tools import parse_tool
from services.compiler.compiler import (
    KIND_EMBEDDING,
    KIND_GRAMMAR,
    KIND_KV_BLOCK,
    KIND_SIGNATURE,
    Compiler,
    kind_of_key,
)

_KIND_TO_PB = {
    KIND_SIGNATURE: compiler_pb2.ARTIFACT_KIND_SIGNATURE,
    KIND_GRAMMAR: compiler_pb2.ARTIFACT_KIND_GRAMMAR,
    KIND_EMBEDDING: compiler_pb2.ARTIFACT_KIND_EMBEDDING,
    KIND_KV_BLOCK: compiler_pb2.ARTIFACT_KIND_KV_BLOCK,
}


def _ref(kind: str, info) -> compiler_pb2.ArtifactRef:
    return compiler_pb2.ArtifactRef(kind=_KIND_TO_PB.get(kind, compiler_pb2.ARTIFACT_KIND_UNSPECIFIED),
                                    id=info.key, size_bytes=info.size, sha256=info.sha256)


class CompilerServicer(compiler_pb2_grpc.CompilerServiceServicer):
    def __init__(self, compiler: Compiler, metrics: Metrics | None = None, derive=None):
        self.compiler = compiler
        self.metrics = metrics or Metrics("compiler")
        self.derive = derive  # a services.compiler.derive.DeriveWorker, or None

    async def Compile(self, request, context):
        if not request.tool.strip():
            raise InvalidArgument("tool is empty: pass the MCP tool as JSON {name, description, inputSchema}")
        tool = parse_tool(request.tool)
        res = await asyncio.to_thread(self.compiler.compile, tool, request.defer_kv_block)
        self.metrics.compiles.labels(str(res.cached).lower()).inc()
        if res.grammar_fallback and not res.cached:
            self.metrics.grammar_fallbacks.inc()
        if self.derive is not None and request.derive_requests:  # queued, never waited for: the tool routes on its
            # text key meanwhile
            await asyncio.to_thread(self.derive.submit, tool)
        return compiler_pb2.CompileResponse(
            tool=res.tool, schema_hash=res.schema_hash, signature=res.signature,
            signature_tokens=res.signature_tokens, grammar_fallback=res.grammar_fallback, cached=res.cached,
            unchecked_keywords=list(res.unchecked_keywords),
            artifacts=[_ref(a.kind, a.info) for a in res.artifacts], kv_block_pending=res.kv_pending,
        )

    async def GetArtifact(self, request, context):
        if not request.id:
            raise InvalidArgument("artifact id is empty")
        data, info = await asyncio.to_thread(self.compiler.get, request.id)
        return compiler_pb2.GetArtifactResponse(ref=_ref(kind_of_key(info.key), info), data=data)
