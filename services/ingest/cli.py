"""``nexus ingest``: register the tools of a live MCP server with a Nexus router.

    nexus ingest --mcp "COMMAND ARGS" [--router ADDR] [--dry-run] [--prefix P]
                 [--env KEY=VALUE ...] [--timeout S] [--batch N]

Starts the MCP server over stdio (``services.ingest.mcp``), lists its tools (all pages), validates
each one like the router does, and registers them through the router's ``RegisterTools`` (which
compiles every tool before it becomes routable), with a progress bar on stderr. ``--dry-run`` only
prints the tool names that would be registered, one per line on stdout. ``--prefix`` is prepended to
every tool name (e.g. ``--prefix time_`` registers ``time_get_current_time``) so servers with
clashing names can share one registry.

``cli/main.py`` wires it in with ``add_ingest_parser(sub)``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from services.common.errors import InvalidArgument, NexusError
from services.common.tools import NAME_RE, parse_tool
from services.ingest.mcp import DEFAULT_TIMEOUT_S, list_mcp_tools

DEFAULT_BATCH = 16


def prepare_tools(raw: Sequence[dict[str, Any]], prefix: str = "") -> tuple[list[dict[str, Any]], list[str]]:
    """Apply ``prefix`` to each tool's name and validate it as the router will.

    Returns ``(tools, problems)``: the valid tools as ``{"name", "description", "inputSchema"}`` dicts
    in server order (first of any duplicate name kept), and one line per tool left out and why."""
    if prefix and not NAME_RE.match(prefix + "x"):
        raise InvalidArgument(f"--prefix {prefix!r}: tool names must match {NAME_RE.pattern}")
    tools: list[dict[str, Any]] = []
    problems: list[str] = []
    seen: set[str] = set()
    for item in raw:
        item = {**item, "name": prefix + str(item.get("name", ""))}
        try:
            tool = parse_tool(item)
        except NexusError as e:
            problems.append(f"skipped {item['name']!r}: {e.message}")
            continue
        if tool.name in seen:
            problems.append(f"skipped {tool.name!r}: duplicate name in the server's tools/list")
            continue
        seen.add(tool.name)
        tools.append({"name": tool.name, "description": tool.description, "inputSchema": tool.input_schema})
    return tools, problems


def register_tools(client, tools: Sequence[dict[str, Any]], *, batch: int = DEFAULT_BATCH,
                   progress: bool = True):
    """Register ``tools`` through ``client.register`` (router RegisterTools: compile included) in
    batches, with a tqdm bar on stderr. Returns the last ``RegisterToolsResponse`` (None if empty)."""
    from tqdm import tqdm

    resp = None
    with tqdm(total=len(tools), desc="register+compile", unit="tool", disable=not progress,
              file=sys.stderr) as bar:
        for i in range(0, len(tools), batch):
            chunk = list(tools[i : i + batch])
            resp = client.register(chunk)
            bar.update(len(chunk))
    return resp


def _parse_env(pairs: Sequence[str]) -> dict[str, str]:
    env: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise InvalidArgument(f"--env {pair!r}: expected KEY=VALUE")
        env[key] = value
    return env


def cmd_ingest(args: argparse.Namespace) -> int:
    from services.common.clients import NexusClient

    if args.batch < 1:
        raise InvalidArgument("--batch must be at least 1")
    env = _parse_env(args.env or ())
    print(f"starting MCP server: {args.mcp}", file=sys.stderr)
    raw = list_mcp_tools(args.mcp, env=env or None, timeout_s=args.timeout)
    tools, problems = prepare_tools(raw, args.prefix)
    for line in problems:
        print(f"warning: {line}", file=sys.stderr)
    print(f"found {len(raw)} tool(s), {len(tools)} valid", file=sys.stderr)
    if args.dry_run:
        for t in tools:
            print(t["name"])
        return 0
    if not tools:
        print("nothing to register", file=sys.stderr)
        return 1
    with NexusClient(router=args.router) as client:
        resp = register_tools(client, tools, batch=args.batch, progress=not args.no_progress)
    print(f"registered {len(tools)} tool(s) from {args.mcp!r} with {args.router} "
          f"(registry version {resp.registry_version}, {resp.total} tools in total)")
    return 0


def add_ingest_parser(subparsers) -> argparse.ArgumentParser:
    """Add ``ingest`` to the ``nexus`` sub-command parsers; returns the new parser."""
    p = subparsers.add_parser(
        "ingest", help="register the tools of a live MCP server (stdio)",
        description="Start an MCP server over stdio, list its tools (every tools/list page), validate them and "
                    "register them through the router's RegisterTools, which compiles each one. --dry-run only "
                    "prints the names that would be registered.")
    p.add_argument("--mcp", required=True, metavar='"COMMAND ARGS"',
                   help="command that starts an MCP server on stdio, shell-quoted (e.g. \"uvx mcp-server-time\")")
    p.add_argument("--router", default="127.0.0.1:50051", metavar="ADDR", help="router address (default: %(default)s)")
    p.add_argument("--dry-run", action="store_true", help="print the tool names found; register nothing")
    p.add_argument("--prefix", default="", metavar="P", help="prepend this to every tool name (e.g. time_)")
    p.add_argument("--env", action="append", metavar="KEY=VALUE",
                   help="extra environment variable for the server (repeatable; the MCP SDK passes only "
                        "PATH, HOME, USER, … by default)")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="S",
                   help="seconds to wait for the server to answer (default: %(default)s)")
    p.add_argument("--batch", type=int, default=DEFAULT_BATCH, metavar="N", help="tools per RegisterTools call")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(fn=cmd_ingest)
    return p
