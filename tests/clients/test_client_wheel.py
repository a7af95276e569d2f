"""`make stubs` builds a client wheel that works on its own against the running cluster."""

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def wheel():
    out = subprocess.run(["make", "-s", "stubs"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    wheels = sorted((REPO / "dist").glob("nexus_client-*.whl"))
    assert wheels and (REPO / "dist" / "nexus.v1.protoset").stat().st_size > 1000
    return wheels[-1]


def test_example_runs_from_the_wheel(cluster, wheel, tmp_path):
    # The wheel first on the path: nexus_client and nexus.v1 are imported from inside the zip.
    code = ("import nexus_client, nexus.v1.router_pb2 as r; print(nexus_client.__file__); print(r.__file__)")
    where = subprocess.run([sys.executable, "-c", code], env={"PYTHONPATH": str(wheel)}, capture_output=True,
                           text=True, timeout=60, cwd=tmp_path)
    assert where.returncode == 0, where.stderr
    assert all(str(wheel) in line for line in where.stdout.split()), where.stdout
    out = subprocess.run([sys.executable, str(REPO / "examples" / "client_example.py"),
                          "open a pull request from feature-x into main in octo/demo",
                          "--router", cluster["router"].addr, "--engine", cluster["engine"].addr],
                         env={"PYTHONPATH": str(wheel)}, capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["tool"] == "github_create_pull_request" and got["schema_valid"]
    assert {"owner", "repo"} <= set(got["arguments"])


def test_typed_client_errors_carry_status(cluster):
    import grpc

    from nexus_client import NexusClient, NexusClientError

    with NexusClient(router=cluster["router"].addr, engine=cluster["engine"].addr, timeout_s=30) as c:
        with pytest.raises(NexusClientError) as ei:
            c.route("")
        assert ei.value.code == grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(NexusClientError) as ei:
            c.generate("hello", "no_such_tool")
        assert ei.value.code == grpc.StatusCode.NOT_FOUND
        r = c.route("what time is it in Tokyo", top_k=2)
        assert r.tool in ("get_current_time", "convert_time") and len(r.candidates) == 2
