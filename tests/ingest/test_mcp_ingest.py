"""Ingest a real MCP server (mcp-server-time from PyPI, over stdio with the official SDK) into Nexus."""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import pytest

from services.common.clients import NexusClientError
from services.common.errors import NexusError
from services.ingest.cli import add_ingest_parser, prepare_tools
from services.ingest.mcp import (
    McpCommandNotFound,
    McpServerExited,
    McpTimeout,
    list_mcp_tools,
)
from tests.conftest import free_port

HERE = Path(__file__).resolve().parent
VENV_BIN = str(Path(sys.executable).parent)
TIME_TOOLS = ["get_current_time", "convert_time"]


@pytest.fixture(scope="module")
def time_server() -> str:
    """The `mcp-server-time` console script (a test dependency installed into the venv)."""
    exe = shutil.which("mcp-server-time", path=VENV_BIN)
    assert exe, "mcp-server-time is not installed in the venv (pip install mcp-server-time)"
    # A fixed zone: the server otherwise asks the host for its local zone.
    return f"{exe} --local-timezone Etc/UTC"


def run_cli(argv: list[str]) -> int:
    """`nexus ingest …` as cli/main.py runs it once `add_ingest_parser` is wired in."""
    parser = argparse.ArgumentParser(prog="nexus")
    add_ingest_parser(parser.add_subparsers(dest="cmd", required=True))
    args = parser.parse_args(["ingest", *argv])
    try:
        return int(args.fn(args) or 0)
    except NexusError as e:
        print(f"nexus: {type(e).__name__}: {e.message}", file=sys.stderr)
        return 2
    except NexusClientError as e:
        print(f"nexus: {e}", file=sys.stderr)
        return 2


def test_lists_the_tools_of_mcp_server_time(time_server):
    tools = list_mcp_tools(time_server, timeout_s=30)
    assert [t["name"] for t in tools] == TIME_TOOLS
    by_name = {t["name"]: t for t in tools}
    assert set(by_name["get_current_time"]) == {"name", "description", "inputSchema"}
    assert "timezone" in by_name["get_current_time"]["description"].lower()
    assert by_name["get_current_time"]["inputSchema"]["required"] == ["timezone"]
    assert set(by_name["convert_time"]["inputSchema"]["properties"]) == {"source_timezone", "time", "target_timezone"}


def test_dry_run_prints_the_tool_names_and_registers_nothing(time_server, capsys):
    # The router address is a closed port: a dry run must not try to reach it.
    assert run_cli(["--mcp", time_server, "--dry-run", "--router", "127.0.0.1:9"]) == 0
    out = capsys.readouterr()
    assert out.out.split() == TIME_TOOLS
    assert "found 2 tool(s), 2 valid" in out.err


def test_prefix_is_prepended_to_every_name(time_server, capsys):
    assert run_cli(["--mcp", time_server, "--dry-run", "--prefix", "time_"]) == 0
    assert capsys.readouterr().out.split() == ["time_get_current_time", "time_convert_time"]


def test_follows_tools_list_pagination_cursors():
    # 7 tools, 3 per page: without following nextCursor only the first 3 come back.
    cmd = [sys.executable, str(HERE / "paged_mcp_server.py"), "7", "3"]
    names = [t["name"] for t in list_mcp_tools(cmd, timeout_s=30)]
    assert names == [f"paged_tool_{i:03d}" for i in range(7)]


def test_missing_command_is_a_clear_error(capsys):
    with pytest.raises(McpCommandNotFound, match="not found on PATH"):
        list_mcp_tools("no-such-mcp-server-xyz --flag")
    assert run_cli(["--mcp", "/nonexistent/mcp-server", "--dry-run"]) == 2
    assert "McpCommandNotFound: MCP server command '/nonexistent/mcp-server' does not exist" in capsys.readouterr().err


def test_a_command_that_never_answers_times_out():
    # Reads nothing, writes nothing: what a non-MCP long-running command looks like on stdio.
    cmd = [sys.executable, "-c", "import time; time.sleep(120)"]
    with pytest.raises(McpTimeout, match=r"within 1.5s: is it an MCP server speaking stdio\?"):
        list_mcp_tools(cmd, timeout_s=1.5)


def test_a_command_that_exits_shows_its_stderr():
    cmd = [sys.executable, "-c", "import sys; print('hello, not json-rpc'); sys.exit('missing API key')"]
    with pytest.raises(McpServerExited) as ei:
        list_mcp_tools(cmd, timeout_s=30)
    assert "not JSON-RPC" in ei.value.message and "missing API key" in ei.value.message


def test_unreachable_router_is_a_clear_error(time_server, capsys):
    assert run_cli(["--mcp", time_server, "--router", f"127.0.0.1:{free_port()}", "--no-progress"]) == 2
    assert "UNAVAILABLE" in capsys.readouterr().err


def test_invalid_tools_are_reported_and_left_out():
    raw = [{"name": "ok_tool", "description": "", "inputSchema": {"type": "object", "properties": {}}},
           {"name": "bad name!", "description": "", "inputSchema": {"type": "object"}},
           {"name": "ok_tool", "description": "again", "inputSchema": {"type": "object"}},
           {"name": "arr", "description": "", "inputSchema": {"type": "array"}}]
    tools, problems = prepare_tools(raw)
    assert [t["name"] for t in tools] == ["ok_tool"]
    assert len(problems) == 3 and "duplicate" in problems[1]


@pytest.mark.integration
def test_ingest_registers_into_a_real_router_and_routes_to_it(time_server, tmp_path, capsys):
    from services.common.clients import NexusClient
    from tests.conftest import start_compiler, start_router

    # A fresh store of our own: the shared `cluster` registry already holds the time tools.
    store = str(tmp_path / "store")
    compiler = start_compiler(store)
    router = start_router(store, compiler.addr)
    try:
        with NexusClient(router=router.addr, compiler=compiler.addr, timeout_s=120) as client:
            assert [t.name for t in client.list_tools().tools] == []
            assert run_cli(["--mcp", time_server, "--router", router.addr]) == 0
            out = capsys.readouterr()
            assert "registered 2 tool(s)" in out.out
            assert "register+compile" in out.err  # the tqdm bar

            listed = {t.name: t for t in client.list_tools().tools}
            assert sorted(listed) == sorted(TIME_TOOLS)
            assert listed["get_current_time"].signature.startswith("get_current_time(timezone: str")

            # ingested tools are routable at once. (The bare "what time is it in Tokyo" is a near tie for the
            # current gate model, 0.456 vs 0.468 for convert_time: a routing miss the evaluation counts, not
            # what this test is about.)
            resp = client.route("what time is it in Tokyo right now?")
            assert resp.tool == "get_current_time"
            assert client.route("convert 09:30 New York time to Berlin time").tool == "convert_time"
    finally:
        router.stop()
        compiler.stop()
