"""The three real services over gRPC on port 0, embedded store: the path a user takes."""

import json

import grpc
import jsonschema
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from nexus.v1 import compiler_pb2, compiler_pb2_grpc, engine_pb2, engine_pb2_grpc, router_pb2, router_pb2_grpc

pytestmark = pytest.mark.integration


def stub(addr, cls):
    return cls(grpc.insecure_channel(addr))


def test_every_server_reports_serving(cluster):
    for name, svc in (("router", "nexus.v1.RouterService"), ("compiler", "nexus.v1.CompilerService"),
                      ("engine", "nexus.v1.EngineService")):
        h = stub(cluster[name].addr, health_pb2_grpc.HealthStub)
        for service in ("", svc):
            resp = h.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
            assert resp.status == health_pb2.HealthCheckResponse.SERVING


def test_route_github_query_to_a_pull_request_tool(cluster):
    resp = cluster["client"].route("open a pull request from feature-x into main in octo/demo", top_k=3)
    assert resp.tool == "github_create_pull_request"
    assert len(resp.candidates) == 3 and resp.candidates[0].tool == resp.tool
    assert resp.candidates[0].score >= resp.candidates[1].score
    assert resp.margin == pytest.approx(resp.candidates[0].score - resp.candidates[1].score, abs=1e-6)
    assert resp.gate in ("auto", "escalated", "slb-only")
    assert resp.escalated == (resp.gate == "escalated")


def test_list_tools_shows_signatures(cluster):
    resp = cluster["client"].list_tools("git_")
    names = [t.name for t in resp.tools]
    assert names == sorted(names) and "git_status" in names and all(n.startswith("git_") for n in names)
    st = next(t for t in resp.tools if t.name == "git_status")
    assert st.signature.startswith("git_status(repo_path: str)") and len(st.schema_hash) == 64


def test_generate_streams_tokens_then_valid_arguments(cluster):
    msgs = list(cluster["client"].generate_stream("open a pull request from feature-x into main in octo/demo",
                                                  "github_create_pull_request"))
    assert all(m.HasField("token") for m in msgs[:-1]) and len(msgs) > 3
    result = msgs[-1].result
    args = json.loads(result.arguments_json)
    # the compiler made the tool's KV block: path A, anchored (no history), nothing re-decoded
    assert result.schema_valid and result.path == engine_pb2.PREFILL_PATH_SPLICE
    assert result.spliced_tokens > 0 and result.recomputed_tokens == 0
    assert "".join(m.token for m in msgs[:-1]).strip() == result.arguments_json
    assert {"owner", "repo", "base", "head", "title"} <= set(args)  # the schema's required arguments
    assert result.timings.first_token_ms <= result.timings.first_arg_token_ms <= result.timings.total_ms
    # result_only: the same call as one message, the result alone
    (only,) = cluster["client"].generate_stream("open a pull request from feature-x into main in octo/demo",
                                                "github_create_pull_request", result_only=True)
    assert only.HasField("result") and only.result.arguments_json == result.arguments_json


def test_generate_path_and_fidelity_options_over_grpc(cluster):
    client = cluster["client"]
    history = [{"role": "user", "content": "I am in the repository /home/me/repo"}]
    text = client.generate("show the git status there", "git_status", history, prefill="text")
    assert text.path == "PREFILL_PATH_TEXT" and text.path_reason == "text prefill requested"
    adaptive = client.generate("show the git status there", "git_status", history, validate=True)
    assert adaptive.path == "PREFILL_PATH_SPLICE" and adaptive.recompute_fraction == 5.0
    assert 1 <= adaptive.recomputed_tokens < adaptive.spliced_tokens
    exact = client.generate("show the git status there", "git_status", history, prefill="splice", fidelity="exact")
    assert exact.path == "PREFILL_PATH_SPLICE" and exact.recomputed_tokens == exact.spliced_tokens
    assert exact.arguments == text.arguments  # R = 100 % reproduces the text prefill


def test_compile_and_get_artifact_roundtrip(cluster, small_tools):
    c = stub(cluster["compiler"].addr, compiler_pb2_grpc.CompilerServiceStub)
    resp = c.Compile(compiler_pb2.CompileRequest(tool=small_tools[0].to_json()), timeout=60)
    assert resp.cached  # registered by the fixture: content-addressed, nothing recompiled
    sig = next(a for a in resp.artifacts if a.kind == compiler_pb2.ARTIFACT_KIND_SIGNATURE)
    got = c.GetArtifact(compiler_pb2.GetArtifactRequest(id=sig.id), timeout=10)
    assert got.data.decode() == resp.signature and got.ref.sha256 == sig.sha256


def _code(fn):
    with pytest.raises(grpc.RpcError) as ei:
        fn()
    return ei.value.code(), ei.value.details()


def test_bad_input_gets_clear_statuses_and_servers_stay_up(cluster):
    r = stub(cluster["router"].addr, router_pb2_grpc.RouterServiceStub)
    e = stub(cluster["engine"].addr, engine_pb2_grpc.EngineServiceStub)
    c = stub(cluster["compiler"].addr, compiler_pb2_grpc.CompilerServiceStub)

    code, _ = _code(lambda: r.Route(router_pb2.RouteRequest(query=""), timeout=10))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    code, _ = _code(lambda: r.Route(router_pb2.RouteRequest(query="x", top_k=-3), timeout=10))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    code, _ = _code(lambda: list(e.Generate(engine_pb2.GenerateRequest(query="hi", tool="no_such_tool"), timeout=30)))
    assert code == grpc.StatusCode.NOT_FOUND
    code, details = _code(lambda: r.RegisterTools(router_pb2.RegisterToolsRequest(tools=['{"name": "x", "inputSchema"']),
                                                  timeout=10))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "not valid JSON" in details and "tools[0]" in details
    bad_schema = json.dumps({"name": "x", "inputSchema": {"type": "object", "properties": {"a": {"type": 7}}}})
    code, details = _code(lambda: c.Compile(compiler_pb2.CompileRequest(tool=bad_schema), timeout=10))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "invalid JSON Schema" in details
    code, _ = _code(lambda: c.GetArtifact(compiler_pb2.GetArtifactRequest(id="sig-nope-nope"), timeout=10))
    assert code == grpc.StatusCode.NOT_FOUND
    code, _ = _code(lambda: r.Route(router_pb2.RouteRequest(query="x" * (17 * 1024 * 1024)), timeout=30))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    code, details = _code(lambda: r.Route(router_pb2.RouteRequest(query="x" * 9000), timeout=10))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "limit" in details
    # still serving after all of that
    assert cluster["client"].route("what time is it in Tokyo").tool in ("get_current_time", "convert_time")


def test_register_then_remove_updates_routing_without_restart(cluster):
    tool = {"name": "summon_llama_herd", "description": "Summon a herd of llamas to a pasture",
            "inputSchema": {"type": "object", "properties": {"count": {"type": "integer"}}}}
    client = cluster["client"]
    reg = client.register([tool])
    assert reg.names == ["summon_llama_herd"]
    assert client.route("please summon a herd of llamas").tool == "summon_llama_herd"
    r = stub(cluster["router"].addr, router_pb2_grpc.RouterServiceStub)
    resp = r.RemoveTools(router_pb2.RemoveToolsRequest(names=["summon_llama_herd", "ghost"]), timeout=10)
    assert list(resp.removed) == ["summon_llama_herd"] and list(resp.missing) == ["ghost"]
    assert client.route("please summon a herd of llamas").tool != "summon_llama_herd"


def test_registration_names_what_the_grammar_cannot_enforce(cluster):
    """A schema keyword the grammar library does not implement (propertyNames) still registers the tool; the response
    says it is checked only after sampling, and the generated call validates against the whole schema."""
    tool = {"name": "tag_llamas", "description": "Put name tags on llamas",
            "inputSchema": {"type": "object", "required": ["tags"], "properties": {"tags": {
                "type": "object", "propertyNames": {"pattern": "^[a-z]+$"},
                "additionalProperties": {"type": "string"}}}}}
    client = cluster["client"]
    try:
        reg = client.register([tool, {"name": "plain_llama", "description": "Count llamas",
                                      "inputSchema": {"type": "object", "properties": {"n": {"type": "integer"}}}}])
        assert reg.names == ["tag_llamas", "plain_llama"]
        assert list(reg.warnings) == ["tag_llamas: propertyNames checked only after sampling (the grammar cannot "
                                      "enforce it)"]
        res = client.generate("tag the llama dolly as brown", tool="tag_llamas", max_tokens=24)
        try:  # what the engine reports is the validation against the whole schema, propertyNames included
            jsonschema.validate(json.loads(res.arguments_json), tool["inputSchema"])
            valid = True
        except (ValueError, jsonschema.ValidationError):
            valid = False
        assert res.schema_valid == valid
    finally:
        client.remove(["tag_llamas", "plain_llama"])


def test_the_client_gets_a_text_answer_without_a_tool(cluster):
    res = cluster["client"].generate("Say hello to the team in one short sentence.", tool="", max_tokens=24)
    assert res.tool == "" and res.arguments_json == "" and res.text.strip()
    assert 0 < res.completion_tokens <= 24 and (not res.truncated or res.completion_tokens == 24)
