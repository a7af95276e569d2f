"""Bad input against the real cluster (router, compiler, engine on port 0): every case gets a clear,
non-INTERNAL status, quickly, and the servers keep serving. Cases already covered by
tests/integration/test_cluster.py (empty / oversized / too-long query, negative top_k, unknown tool,
invalid JSON, invalid JSON Schema) are not repeated here; the .atb / state-blob codecs are exercised
in tests/native and tests/fuzz."""

from __future__ import annotations

import json
import time
from pathlib import Path

import grpc
import pytest

from nexus.v1 import (
    common_pb2,
    compiler_pb2,
    compiler_pb2_grpc,
    engine_pb2,
    engine_pb2_grpc,
    router_pb2,
    router_pb2_grpc,
)

pytestmark = pytest.mark.integration

QUERY = "what time is it in Tokyo?"
TIME_TOOLS = ("get_current_time", "convert_time")


def stub(addr: str, cls):
    return cls(grpc.insecure_channel(addr, options=[("grpc.max_send_message_length", 64 << 20)]))


def status_of(fn) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as ei:
        fn()
    return ei.value.code(), ei.value.details() or ""


def still_serving(cluster) -> None:
    assert cluster["client"].route(QUERY, timeout_s=30).tool in TIME_TOOLS


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """One length-delimited protobuf field, by hand (the Python runtime refuses to encode invalid UTF-8)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


NOT_UTF8 = b"open \xff\xfe a pull request \xc3\x28"


@pytest.mark.parametrize(("service", "method", "raw"), [
    ("router", "/nexus.v1.RouterService/Route", _field(1, NOT_UTF8)),
    ("router", "/nexus.v1.RouterService/Route", _field(1, b"ok") + _field(2, _field(2, NOT_UTF8))),  # history
    ("router", "/nexus.v1.RouterService/RegisterTools", _field(1, b'{"name": "\xff"}')),
    ("compiler", "/nexus.v1.CompilerService/Compile", _field(1, NOT_UTF8)),
    ("router", "/nexus.v1.RouterService/Route", b"\x0a\xff\xff\xff\xff\x0f garbage"),  # not protobuf at all
])
def test_undecodable_requests_are_invalid_argument(rc_cluster, service, method, raw):
    ch = grpc.insecure_channel(rc_cluster[service].addr)
    call = ch.unary_unary(method)  # no serializers: the raw bytes go on the wire as they are
    code, details = status_of(lambda: call(raw, timeout=10))
    assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, details)
    assert "could not be decoded" in details
    ch.close()
    still_serving(rc_cluster)


def test_undecodable_streaming_request_is_invalid_argument(cluster):
    ch = grpc.insecure_channel(cluster["engine"].addr)
    call = ch.unary_stream("/nexus.v1.EngineService/Generate")
    code, _ = status_of(lambda: list(call(_field(1, NOT_UTF8) + _field(2, b"get_current_time"), timeout=10)))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    ch.close()


@pytest.mark.parametrize("top_k", [2**31 - 1, 101, -(2**31)])
def test_huge_or_negative_top_k_is_invalid_argument(rc_cluster, top_k):
    r = stub(rc_cluster["router"].addr, router_pb2_grpc.RouterServiceStub)
    code, details = status_of(lambda: r.Route(router_pb2.RouteRequest(query=QUERY, top_k=top_k), timeout=10))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "top_k" in details


def test_top_k_at_the_limit_returns_every_tool(rc_cluster, small_tools):
    resp = rc_cluster["client"].route_pb(QUERY, top_k=100)
    assert len(resp.candidates) == len({c.tool for c in resp.candidates}) <= 100
    assert len(resp.candidates) >= len(small_tools)


def _history(n: int) -> list[common_pb2.Turn]:
    roles = ("user", "assistant", "tool")
    return [common_pb2.Turn(role=roles[i % 3], content=f"turn {i}: checked the clock in city {i}") for i in range(n)]


def test_route_with_10000_turns_answers_and_10001_is_refused(rc_cluster):
    r = stub(rc_cluster["router"].addr, router_pb2_grpc.RouterServiceStub)
    t0 = time.monotonic()
    resp = r.Route(router_pb2.RouteRequest(query=QUERY, history=_history(10_000)), timeout=60)
    assert resp.tool in TIME_TOOLS and time.monotonic() - t0 < 30
    code, details = status_of(lambda: r.Route(router_pb2.RouteRequest(query=QUERY, history=_history(10_001)),
                                              timeout=30))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "history" in details


def test_generate_with_10000_turns_answers_and_10001_is_refused(cluster):
    e = stub(cluster["engine"].addr, engine_pb2_grpc.EngineServiceStub)
    req = engine_pb2.GenerateRequest(query=QUERY, tool="get_current_time", history=_history(10_000), max_tokens=48)
    final = [m.result for m in e.Generate(req, timeout=120) if m.HasField("result")]
    assert len(final) == 1 and final[0].tool == "get_current_time"
    assert final[0].prompt_tokens < 4096  # the history was pruned, not prefilled
    req = engine_pb2.GenerateRequest(query=QUERY, tool="get_current_time", history=_history(10_001))
    code, details = status_of(lambda: list(e.Generate(req, timeout=30)))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "history" in details


@pytest.mark.parametrize("query", ["   \n\t ", "\u200b" * 0 + " "])
def test_blank_query_is_invalid_argument(rc_cluster, query):
    r = stub(rc_cluster["router"].addr, router_pb2_grpc.RouterServiceStub)
    code, _ = status_of(lambda: r.Route(router_pb2.RouteRequest(query=query), timeout=10))
    assert code == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize("raw", ["[]", "null", '"a tool"', "42", '{"name": ""}', '{"name": "a b"}',
                                 '{"name": "x", "inputSchema": []}', '{"name": "x", "description": 7}',
                                 '{"name": "x", "inputSchema": {"type": "string"}}'])
def test_malformed_tool_documents_are_invalid_argument(rc_cluster, raw):
    c = stub(rc_cluster["compiler"].addr, compiler_pb2_grpc.CompilerServiceStub)
    code, details = status_of(lambda: c.Compile(compiler_pb2.CompileRequest(tool=raw), timeout=10))
    assert code == grpc.StatusCode.INVALID_ARGUMENT, details


def _compile(cluster, tool: dict, timeout: float = 60) -> compiler_pb2.CompileResponse:
    c = stub(cluster["compiler"].addr, compiler_pb2_grpc.CompilerServiceStub)
    return c.Compile(compiler_pb2.CompileRequest(tool=json.dumps(tool)), timeout=timeout)


def test_ref_cycles_compile_without_hanging(rc_cluster):
    # Decision: a schema whose $refs form a cycle is valid JSON Schema (recursive types are legitimate),
    # so it compiles; the signature cuts the recursion and the grammar either expresses it or falls back
    # to the generic object grammar. What must never happen is a hang or a crash.
    for tool in (
        {"name": "ref_cycle_pair", "description": "two definitions that point at each other",
         "inputSchema": {"type": "object", "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
                         "properties": {"x": {"$ref": "#/$defs/a"}}}},
        {"name": "ref_cycle_tree", "description": "a recursive tree node",
         "inputSchema": {"type": "object", "$defs": {"node": {"type": "object", "properties": {
             "value": {"type": "string"}, "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}},
             "properties": {"root": {"$ref": "#/$defs/node"}}}},
        {"name": "ref_cycle_root", "description": "refers to the whole schema",
         "inputSchema": {"type": "object", "properties": {"again": {"$ref": "#"}}}},
    ):
        t0 = time.monotonic()
        resp = _compile(rc_cluster, tool, timeout=60)
        assert resp.tool == tool["name"] and resp.signature and time.monotonic() - t0 < 30


def test_dangling_ref_is_handled(rc_cluster):
    tool = {"name": "ref_dangling", "inputSchema": {"type": "object", "properties": {"x": {"$ref": "#/$defs/nope"}}}}
    try:
        resp = _compile(rc_cluster, tool)
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e.details()
    else:
        assert resp.signature


def test_10000_property_schema_is_answered_quickly_never_internal(rc_cluster):
    # Decision: a 10 000-property schema within the 256 KiB tool-document limit is legal JSON Schema. Its
    # signature (~80 000 tokens) cannot fit any model context, so the compiler may refuse it with
    # RESOURCE_EXHAUSTED (or INVALID_ARGUMENT), or compile it without a KV block; it must answer within
    # seconds and never with INTERNAL. The same properties with more text exceed the document limit and
    # are refused with RESOURCE_EXHAUSTED before any work.
    small = {"name": "ten_thousand_props", "description": "many optional flags",
             "inputSchema": {"type": "object", "properties": {f"p{i}": {} for i in range(10_000)}}}
    t0 = time.monotonic()
    try:
        resp = _compile(rc_cluster, small, timeout=120)
    except grpc.RpcError as e:
        assert e.code() in (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.INVALID_ARGUMENT), \
            (e.code(), e.details())
    else:
        assert resp.tool == "ten_thousand_props" and resp.signature
    assert time.monotonic() - t0 < 90
    big = {"name": "ten_thousand_typed_props", "inputSchema": {
        "type": "object", "properties": {f"p{i}": {"type": "string", "description": "a flag"} for i in range(10_000)}}}
    code, details = status_of(lambda: _compile(rc_cluster, big, timeout=30))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "limit" in details
    still_serving(rc_cluster)


def _artifact_file(cluster, artifact_id: str) -> Path:
    return Path(cluster["store_url"]) / "objects" / artifact_id


@pytest.mark.parametrize("damage", ["truncate", "bitflip_payload", "bitflip_header", "empty"])
def test_damaged_stored_artifact_is_data_loss(rc_cluster, damage):
    tool = {"name": f"damaged_{damage}", "description": "an artifact that gets damaged on disk",
            "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}}}
    resp = _compile(rc_cluster, tool)
    sig = next(a for a in resp.artifacts if a.kind == compiler_pb2.ARTIFACT_KIND_SIGNATURE)
    path = _artifact_file(rc_cluster, sig.id)
    good = path.read_bytes()
    blob = bytearray(good)
    if damage == "truncate":
        blob = blob[: len(blob) - 3]
    elif damage == "bitflip_payload":
        blob[-2] ^= 0x10
    elif damage == "bitflip_header":
        blob[14] ^= 0x01
    else:
        blob = bytearray()
    path.write_bytes(bytes(blob))
    c = stub(rc_cluster["compiler"].addr, compiler_pb2_grpc.CompilerServiceStub)
    try:
        code, details = status_of(lambda: c.GetArtifact(compiler_pb2.GetArtifactRequest(id=sig.id), timeout=10))
        assert code == grpc.StatusCode.DATA_LOSS, details
    finally:
        path.write_bytes(good)
    assert c.GetArtifact(compiler_pb2.GetArtifactRequest(id=sig.id), timeout=10).data.decode() == resp.signature


def test_short_deadline_is_deadline_exceeded_and_the_engine_recovers(cluster):
    e = stub(cluster["engine"].addr, engine_pb2_grpc.EngineServiceStub)
    req = engine_pb2.GenerateRequest(query=QUERY, tool="get_current_time", max_tokens=64)
    code, _ = status_of(lambda: list(e.Generate(req, timeout=0.005)))
    assert code == grpc.StatusCode.DEADLINE_EXCEEDED
    final = [m.result for m in e.Generate(req, timeout=120) if m.HasField("result")]
    assert final and final[0].schema_valid
