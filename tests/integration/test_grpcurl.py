"""The real grpcurl binary against the running cluster, through server reflection, as the README shows."""

import json
import subprocess

import pytest

pytestmark = pytest.mark.integration


def grpcurl_run(grpcurl, *args, timeout=120):
    out = subprocess.run([grpcurl, "-plaintext", *args], capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_list_and_describe_through_reflection(cluster, grpcurl):
    services = grpcurl_run(grpcurl, cluster["router"].addr, "list").split()
    assert "nexus.v1.RouterService" in services and "grpc.health.v1.Health" in services
    desc = grpcurl_run(grpcurl, cluster["router"].addr, "describe", "nexus.v1.RouteRequest")
    assert "query" in desc and "top_k" in desc and "history" in desc
    assert "nexus.v1.EngineService" in grpcurl_run(grpcurl, cluster["engine"].addr, "list")


def test_route_and_generate_with_grpcurl(cluster, grpcurl):
    q = "open a pull request from feature-x into main in octo/demo"
    route = json.loads(grpcurl_run(grpcurl, "-d", json.dumps({"query": q}), cluster["router"].addr,
                                   "nexus.v1.RouterService/Route"))
    assert route["tool"] == "github_create_pull_request"
    out = grpcurl_run(grpcurl, "-d", json.dumps({"query": q, "tool": route["tool"]}), cluster["engine"].addr,
                      "nexus.v1.EngineService/Generate")
    # grpcurl prints one JSON document per streamed message
    docs = [json.loads(d) for d in out.replace("}\n{", "}\x00{").split("\x00")]
    assert any("token" in d for d in docs)
    result = docs[-1]["result"]
    assert "owner" in json.loads(result["arguments_json"]) and result["schema_valid"]


def test_grpcurl_sees_invalid_argument(cluster, grpcurl):
    out = subprocess.run([grpcurl, "-plaintext", "-d", '{"query": ""}', cluster["router"].addr,
                          "nexus.v1.RouterService/Route"], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "InvalidArgument" in out.stderr
