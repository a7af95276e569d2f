"""Fault scenarios against real processes, shared by tests/reliability/test_faults.py (which asserts on
them) and bench/reliability.py (which reports them in reports/reliability.json). Each returns a dict of
what was injected and what was observed."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import grpc

from nexus.v1 import compiler_pb2, compiler_pb2_grpc, router_pb2, router_pb2_grpc

REPO = Path(__file__).resolve().parents[2]
QUERY = "what time is it in Tokyo?"


def _tool(name: str) -> str:
    return json.dumps({"name": name, "description": f"fault-test tool {name}: store a note",
                       "inputSchema": {"type": "object", "properties": {"note": {"type": "string"}}}})


def _code(fn) -> str:
    try:
        fn()
    except grpc.RpcError as e:
        return e.code().name
    return "OK"


def wait_for(cond, timeout: float, what: str, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    while True:
        out = cond()
        if out:
            return out
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(interval)


def redis_outage(redis, tools, start_compiler, start_router, routes: int = 20) -> dict:
    """Stop Redis under a running router + compiler, then bring it back on the same port and data dir.

    ``redis`` is a stopped-or-running ``RedisProcess``; ``tools`` a few tools to register first."""
    out: dict = {"fault": "redis stopped mid-run, then restarted (same port, same AOF)"}
    compiler = start_compiler(redis.url)
    router = start_router(redis.url, compiler.addr)
    try:
        r = router_pb2_grpc.RouterServiceStub(grpc.insecure_channel(router.addr))
        c = compiler_pb2_grpc.CompilerServiceStub(grpc.insecure_channel(compiler.addr))
        reg = r.RegisterTools(router_pb2.RegisterToolsRequest(tools=[t.to_json() for t in tools]), timeout=300)
        before = r.Route(router_pb2.RouteRequest(query=QUERY), timeout=30).tool
        sig_ids = [a.id for a in c.Compile(compiler_pb2.CompileRequest(tool=tools[0].to_json()), timeout=60).artifacts]

        redis.stop()
        out["routes_during_outage"] = routes
        out["route_errors_during_outage"] = 0
        out["route_same_answer"] = True
        for _ in range(routes):
            try:
                tool = r.Route(router_pb2.RouteRequest(query=QUERY), timeout=30).tool
                out["route_same_answer"] &= tool == before
            except grpc.RpcError:
                out["route_errors_during_outage"] += 1
        out["compile_status_during_outage"] = _code(
            lambda: c.Compile(compiler_pb2.CompileRequest(tool=_tool("fault_outage_tool")), timeout=30))
        out["get_artifact_status_during_outage"] = _code(
            lambda: c.GetArtifact(compiler_pb2.GetArtifactRequest(id=sig_ids[0]), timeout=30))
        out["register_status_during_outage"] = _code(
            lambda: r.RegisterTools(router_pb2.RegisterToolsRequest(tools=[_tool("fault_outage_tool2")]), timeout=30))

        redis.start()
        t0 = time.monotonic()
        resp = wait_for(lambda: _try(lambda: c.Compile(compiler_pb2.CompileRequest(tool=_tool("fault_outage_tool")),
                                                       timeout=30)), 60, "compiler recovery")
        out["compile_recovered"] = bool(resp.signature)
        out["recovery_s"] = round(time.monotonic() - t0, 3)
        listed = r.ListTools(router_pb2.ListToolsRequest(), timeout=30)
        out["registry_tools_after_restart"] = len(listed.tools)
        out["registry_tools_registered"] = len(reg.names)
        lost = 0
        for aid in sig_ids:
            if _code(lambda aid=aid: c.GetArtifact(compiler_pb2.GetArtifactRequest(id=aid), timeout=30)) != "OK":
                lost += 1
        out["artifacts_checked"], out["artifacts_lost"] = len(sig_ids), lost
        out["requests_served"] = routes + len(sig_ids) + 4
    finally:
        router.stop()
        compiler.stop()
    return out


def _try(fn):
    try:
        return fn()
    except grpc.RpcError:
        return None


def redis_kill9_durability(redis, n_objects: int = 50) -> dict:
    """SIGKILL Redis right after writes acknowledged; restart on the same AOF: every object must read back
    and verify (appendfsync always)."""
    from services.common.store import RedisStore

    store = RedisStore(redis.url, namespace="kill9")
    written = {f"obj-{i:03d}-x": os.urandom(1000 + i) for i in range(n_objects)}
    for k, v in written.items():
        store.put(k, v, {"i": k})
    version = store.registry_put([])
    redis.stop(kill=True)
    redis.start()
    lost = sum(1 for k, v in written.items() if _get_or_none(store, k) != v)
    out = {"fault": "redis SIGKILL after acknowledged writes, restart on the same AOF",
           "objects_written": n_objects, "artifacts_lost": lost,
           "registry_version_kept": store.registry_version() == version}
    store.close()
    return out


def _get_or_none(store, key):
    try:
        return store.get(key)
    except Exception:  # noqa: BLE001 - any failure counts as lost
        return None


def redis_multi_interrupted(redis) -> dict:
    """A client that dies between MULTI and EXEC (its socket closes): Redis discards the queued commands,
    so a registry update is applied whole or not at all."""
    from services.common.store import RedisStore
    from services.common.tools import parse_tool

    store = RedisStore(redis.url, namespace="multi")
    store.registry_put([parse_tool(_tool("multi_before"))])
    before = store.registry_snapshot()
    s = socket.create_connection(("127.0.0.1", redis.port))
    cmds = [["MULTI"], ["HSET", "multi:registry", "multi_half", _tool("multi_half")], ["INCR", "multi:registry:version"]]
    if redis.password:
        cmds.insert(0, ["AUTH", redis.password])
    for cmd in cmds:
        s.sendall(f"*{len(cmd)}\r\n".encode() + b"".join(f"${len(a.encode())}\r\n{a}\r\n".encode() for a in cmd))
    time.sleep(0.2)  # let Redis queue the commands; then the "process dies": no EXEC
    s.close()
    after = wait_for(lambda: store.registry_snapshot(), 5, "snapshot")
    out = {"fault": "client killed between MULTI and EXEC", "registry_unchanged": (
        sorted(after[0]) == sorted(before[0]) and after[1] == before[1]), "artifacts_lost": 0}
    store.close()
    return out


_KILL_IN_PUT = r"""
import os, sys
from services.common.store import LocalStore
store = LocalStore(sys.argv[1])
hook = sys.argv[2]
real = getattr(os, hook)
def die(*a, **k):
    os._exit(9)  # the process dies here: no cleanup, no exception handlers
setattr(os, hook, die)
store.put("sig-victim-0000", b"NEW" * 100000, {"v": 2})
"""


def interrupted_local_writes(root: Path) -> dict:
    """Kill a writer process inside ``LocalStore.put`` (before fsync, before rename): the key keeps its old,
    verified content; no partial object is ever visible under it."""
    from services.common.store import LocalStore

    store = LocalStore(root)
    old = b"OLD" * 1000
    store.put("sig-victim-0000", old, {"v": 1})
    results = {}
    for hook in ("fsync", "replace"):
        p = subprocess.run([sys.executable, "-c", _KILL_IN_PUT, str(root), hook], cwd=REPO, capture_output=True,
                           timeout=60)
        data, info = store.get_with_info("sig-victim-0000")
        results[hook] = {"exit": p.returncode, "old_content_intact": data == old and info.meta == {"v": 1}}
    # a fresh key killed mid-write is simply absent
    p = subprocess.run([sys.executable, "-c", _KILL_IN_PUT.replace("sig-victim-0000", "sig-fresh-0000"), str(root),
                        "replace"], cwd=REPO, capture_output=True, timeout=60)
    temp_files = sorted(x.name for x in (root / "objects").iterdir() if x.name.startswith(".tmp-"))
    return {"fault": "writer process killed inside LocalStore.put (at fsync, at rename)", "kills": results,
            "fresh_key_visible": store.exists("sig-fresh-0000"), "fresh_exit": p.returncode,
            "leftover_temp_files": len(temp_files),
            "artifacts_lost": sum(not r["old_content_intact"] for r in results.values())}


def engine_restart(store_url: str, tool_name: str, start_engine) -> dict:
    """Stop the engine and start a new one on the same store: the tool's artifacts load from the store and
    Generate answers as before (greedy decoding: the same arguments)."""
    from nexus_client import NexusClient

    def generate(engine) -> str:
        with NexusClient(engine=engine.addr, timeout_s=180) as c:
            return c.generate(QUERY, tool_name, max_tokens=48).arguments_json

    first = start_engine(store_url)
    try:
        before = generate(first)
    finally:
        first.stop()
    second = start_engine(store_url)
    try:
        after = generate(second)
    finally:
        second.stop()
    return {"fault": "engine stopped and restarted on the same store", "generate_after_restart_ok": bool(after),
            "same_arguments": before == after, "requests_served": 2, "artifacts_lost": 0 if after else 1}
