"""Route restricted to a set of registered tools (RouteRequest.allowed_tools), through the real router over gRPC."""

import grpc
import pytest

from services.common.clients import NexusClientError

pytestmark = pytest.mark.integration

PR_QUERY = "open a pull request from feature-x into main in octo/demo"


def test_a_route_restricted_to_two_tools_picks_among_them_only(cluster):
    client = cluster["client"]
    assert client.route(PR_QUERY).tool == "github_create_pull_request"  # unrestricted: the obvious tool
    two = ["git_commit", "get_current_time"]
    r = client.route(PR_QUERY, top_k=5, allowed_tools=two)
    assert r.tool in two and {c.tool for c in r.candidates} <= set(two)
    assert len(r.candidates) == 2  # top_k is bounded by the allowed set
    # the allowed set containing the obvious tool: it is still chosen
    r = client.route(PR_QUERY, allowed_tools=["git_status", "github_create_pull_request"])
    assert r.tool == "github_create_pull_request"


def test_an_unregistered_allowed_tool_is_not_found(cluster):
    with pytest.raises(NexusClientError) as e:
        cluster["client"].route(PR_QUERY, allowed_tools=["git_commit", "no_such_tool"])
    assert e.value.code == grpc.StatusCode.NOT_FOUND and "no_such_tool" in e.value.details
