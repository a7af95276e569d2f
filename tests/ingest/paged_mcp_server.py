"""A real MCP server over stdio (official SDK, low-level ``Server``) whose ``tools/list`` is paginated.

    python paged_mcp_server.py N_TOOLS PAGE_SIZE

Serves ``N_TOOLS`` tools ``paged_tool_000``, … ``PAGE_SIZE`` per page with an opaque ``nextCursor``,
so a client that ignores the cursor sees only the first page. Used by tests/ingest only.
"""

from __future__ import annotations

import sys

import anyio
import mcp_types as types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server


def main() -> None:
    n_tools, page_size = int(sys.argv[1]), int(sys.argv[2])
    tools = [
        types.Tool(
            name=f"paged_tool_{i:03d}",
            description=f"Paged test tool number {i}",
            input_schema={"type": "object", "properties": {"x": {"type": "integer", "description": "a number"}},
                          "required": ["x"]},
        )
        for i in range(n_tools)
    ]

    async def list_tools(ctx, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        start = int(params.cursor.removeprefix("page-")) if params is not None and params.cursor else 0
        end = start + page_size
        return types.ListToolsResult(tools=tools[start:end], next_cursor=f"page-{end}" if end < n_tools else None)

    server = Server("nexus-paged-test", on_list_tools=list_tools)

    async def run() -> None:
        async with stdio_server() as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())

    anyio.run(run)


if __name__ == "__main__":
    main()
