"""List the tools of a real MCP server over stdio, with the official ``mcp`` Python SDK.

``list_mcp_tools("uvx mcp-server-time")`` spawns the command, negotiates the protocol
(``server/discover``, falling back to the ``initialize`` handshake for older servers), pages
through ``tools/list`` following ``nextCursor`` and returns each tool as a plain dict
``{"name", "description", "inputSchema"}`` — the form ``RegisterTools`` takes. The server
process is always stopped before the function returns (stdin closed, then SIGTERM/SIGKILL to
its process group, as the SDK's stdio transport does).

Failures are ``NexusError`` subclasses with a message a user can act on:

    McpIngestError (FailedPrecondition)   the command ran but did not behave as an MCP server
    ├── McpServerExited                   it exited / closed stdout before answering (stderr tail shown)
    └── McpTimeout (+DeadlineExceeded)    no answer within ``timeout_s`` (is it an MCP server on stdio?)
    McpCommandNotFound (NotFound)         the executable does not exist or is not executable
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import shutil
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from services.common.errors import DeadlineExceeded, FailedPrecondition, InvalidArgument, NotFound

DEFAULT_TIMEOUT_S = 30.0
# A server whose cursors never end is a bug on its side; stop instead of looping forever.
MAX_PAGES = 1000
_STDERR_TAIL_CHARS = 2000


class McpIngestError(FailedPrecondition):
    """The command started but did not behave as an MCP server over stdio."""


class McpServerExited(McpIngestError):
    """The server closed its stdout (usually: exited) before answering."""


class McpTimeout(DeadlineExceeded, McpIngestError):
    """The server did not answer the handshake / ``tools/list`` in time (DEADLINE_EXCEEDED)."""


class McpCommandNotFound(NotFound):
    """The MCP server's executable does not exist or cannot be executed."""


def parse_command(command: str | Sequence[str]) -> list[str]:
    """``"COMMAND ARGS"`` (shell-quoted) or an argv list -> argv. Raises ``InvalidArgument`` when empty."""
    argv = shlex.split(command) if isinstance(command, str) else [str(a) for a in command]
    if not argv or not argv[0]:
        raise InvalidArgument("empty MCP server command (expected e.g. --mcp \"uvx mcp-server-time\")")
    return argv


def resolve_executable(argv0: str, env: Mapping[str, str] | None = None) -> str:
    """The absolute path of ``argv0`` (looked up on ``PATH`` unless it contains a slash)."""
    path = (env or {}).get("PATH", os.environ.get("PATH", os.defpath))
    if os.sep in argv0:
        if os.path.isfile(argv0) and os.access(argv0, os.X_OK):
            return os.path.abspath(argv0)
        what = "is not executable" if os.path.exists(argv0) else "does not exist"
        raise McpCommandNotFound(f"MCP server command {argv0!r} {what}")
    found = shutil.which(argv0, path=path)
    if found is None:
        raise McpCommandNotFound(f"MCP server command {argv0!r} not found on PATH")
    return found


def tool_to_dict(tool: Any) -> dict[str, Any]:
    """An SDK ``Tool`` (pydantic model) -> ``{"name", "description", "inputSchema"}``."""
    schema = tool.input_schema if tool.input_schema is not None else {"type": "object", "properties": {}}
    return {"name": tool.name, "description": tool.description or "", "inputSchema": dict(schema)}


@contextlib.contextmanager
def _quiet_sdk_parse_errors() -> Iterator[list[logging.LogRecord]]:
    """The SDK logs a traceback for every non-JSON-RPC stdout line (any non-MCP command prints
    some). Collect those records instead, so the error we raise is the one the user sees."""
    logger = logging.getLogger("mcp.client.stdio")
    records: list[logging.LogRecord] = []

    class _Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler, propagate = _Collect(level=logging.DEBUG), logger.propagate
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield records
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate


def _leaf_exceptions(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for e in exc.exceptions for leaf in _leaf_exceptions(e)]
    return [exc]


def _stderr_tail(f) -> str:
    try:
        f.flush()
        f.seek(0)
        text = f.read()
    except (OSError, ValueError):
        return ""
    text = text.strip()
    return text[-_STDERR_TAIL_CHARS:] if text else ""


async def list_mcp_tools_async(
    command: str | Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    mode: str = "auto",
) -> list[dict[str, Any]]:
    """Start the MCP server ``command`` over stdio, list all its tools (every ``tools/list`` page)
    and stop it. ``env`` is merged over the SDK's safe default environment (PATH, HOME, …; the
    SDK does not pass the whole environment to servers). ``mode`` is the SDK's connect mode:
    ``"auto"`` (discover, then the legacy handshake) or ``"legacy"``."""
    import anyio
    from mcp import Client, MCPError, StdioServerParameters, stdio_client

    argv = parse_command(command)
    exe = resolve_executable(argv[0], env)
    params = StdioServerParameters(command=exe, args=argv[1:], env=dict(env) if env else None, cwd=cwd)
    shown = shlex.join(argv)
    tools: list[dict[str, Any]] = []
    with tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace") as errlog, \
            _quiet_sdk_parse_errors() as bad_lines:
        try:
            with anyio.fail_after(timeout_s):
                # A Transport (not the bare parameters) so the server's stderr goes to our file.
                async with Client(stdio_client(params, errlog=errlog), mode=mode) as client:
                    cursor: str | None = None
                    seen_cursors: set[str] = set()
                    for _ in range(MAX_PAGES):
                        page = await client.list_tools(cursor=cursor, cache_mode="bypass")
                        tools.extend(tool_to_dict(t) for t in page.tools)
                        cursor = page.next_cursor
                        if not cursor:
                            break
                        if cursor in seen_cursors:
                            raise McpIngestError(f"MCP server {shown!r} repeated tools/list cursor {cursor!r}")
                        seen_cursors.add(cursor)
                    else:
                        raise McpIngestError(f"MCP server {shown!r} returned more than {MAX_PAGES} tools/list pages")
        except TimeoutError as e:
            hint = f"; it printed {len(bad_lines)} line(s) that are not JSON-RPC" if bad_lines else ""
            tail = _stderr_tail(errlog)
            raise McpTimeout(
                f"no MCP answer from {shown!r} within {timeout_s:g}s: is it an MCP server speaking stdio?{hint}"
                + (f"\n--- its stderr ---\n{tail}" if tail else "")
            ) from e
        except McpIngestError:
            raise
        except BaseException as e:  # the SDK raises through task groups: look at the leaves
            leaves = _leaf_exceptions(e)
            if any(isinstance(x, (KeyboardInterrupt, SystemExit, anyio.get_cancelled_exc_class())) for x in leaves):
                raise
            ours = next((x for x in leaves if isinstance(x, McpIngestError)), None)
            if ours is not None:
                raise ours from e
            tail = _stderr_tail(errlog)
            err = next((x for x in leaves if isinstance(x, MCPError)), None)
            os_err = next((x for x in leaves if isinstance(x, OSError)), None)
            if err is not None and err.code == -32000:  # CONNECTION_CLOSED
                msg = f"MCP server {shown!r} exited (or closed stdout) before answering"
                if bad_lines:
                    msg += f"; it printed {len(bad_lines)} line(s) that are not JSON-RPC: not an MCP server?"
                raise McpServerExited(msg + (f"\n--- its stderr ---\n{tail}" if tail else "")) from e
            if err is not None:
                raise McpIngestError(
                    f"MCP server {shown!r} answered with error {err.code}: {err.message}"
                    + ("; is it an MCP server?" if bad_lines or err.code == -32601 else "")
                    + (f"\n--- its stderr ---\n{tail}" if tail else "")
                ) from e
            if isinstance(os_err, (FileNotFoundError, PermissionError)):
                raise McpCommandNotFound(f"could not start MCP server {shown!r}: {os_err}") from e
            if os_err is not None:
                raise McpServerExited(f"MCP server {shown!r} failed: {os_err}"
                                      + (f"\n--- its stderr ---\n{tail}" if tail else "")) from e
            raise
    return tools


def list_mcp_tools(command: str | Sequence[str], **kwargs: Any) -> list[dict[str, Any]]:
    """Synchronous ``list_mcp_tools_async`` (runs its own event loop)."""
    import anyio

    return anyio.run(lambda: list_mcp_tools_async(command, **kwargs))
