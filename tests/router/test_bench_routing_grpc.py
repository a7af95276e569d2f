"""bench/routing_grpc.py against real router processes (a few requests; latency figures are the bench's, not
asserted here): the arms answer every request, only the model arm loads exemplar keys, the default embeds with the
shipped INT8 graph, the plot is written."""

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO

GATE = REPO / "var" / "models" / "gate"


def _run(tmp_path, *extra):
    return subprocess.run([sys.executable, str(REPO / "bench" / "routing_grpc.py"), "--tools",
                           str(REPO / "data" / "mcp_tools"), "--queries", str(REPO / "data" / "queries" / "train.jsonl"),
                           "--gate", str(GATE), "--json", str(tmp_path / "rg.json"), *extra],
                          capture_output=True, text=True, timeout=900, cwd=REPO)


@pytest.fixture(scope="module")
def every_arm(tmp_path_factory):
    """One run with the arms side by side (a router process each, started once for all the tests below)."""
    if not (GATE / "gate.json").is_file():
        pytest.fail("no gate model at var/models/gate: run `make setup` (it links the shipped one)")
    tmp = tmp_path_factory.mktemp("routing-grpc")
    out = _run(tmp, "--limit", "6", "--repeats", "2", "--arms", "model,text")
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads((tmp / "rg.json").read_text()), tmp


def test_arms_run_side_by_side_over_grpc(every_arm):
    rep, tmp = every_arm
    doc = json.loads((GATE / "gate.json").read_text())
    assert rep["registry_size"] == 338
    assert set(rep["arms"]) == {"model", "text"} and rep["arm_env"]["model"] == {}
    for arm in rep["arms"].values():
        assert arm["n_requests"] == 12 and arm["rtt_ms_p50"] > 0 and arm["rtt_ms_p99"] >= arm["rtt_ms_p50"]
    assert rep["arms"]["model"]["exemplar_keys_loaded"] == (doc["slb"]["exemplar_weight"] > 0)
    assert not rep["arms"]["text"]["exemplar_keys_loaded"]
    # no second stage: with alpha = 0 nothing escalates
    if doc["alpha"] <= 0:
        assert rep["arms"]["model"]["escalation_rate"] == rep["arms"]["text"]["escalation_rate"] == 0.0
    assert rep["p50_ratio_model_over_text"] > 0 and (tmp / "rg.png").stat().st_size > 10_000
    assert 0.0 <= rep["same_tool_model_and_text"] <= 1.0


def test_the_default_embeds_with_the_shipped_int8_graph_over_grpc(every_arm):
    """A real router process with the default config embeds with the shipped INT8 graph (models/ ships no fp32
    graph)."""
    rep, _ = every_arm
    arms = rep["arms"]
    assert arms["model"]["query_encoder_backend"] == arms["text"]["query_encoder_backend"] == "onnxruntime-int8"
    assert arms["model"]["n_requests"] == 12 and arms["model"]["exemplar_keys_loaded"]


def test_an_fp32_arm_over_the_serving_form_is_a_clear_error(tmp_path):
    out = _run(tmp_path, "--arms", "model,fp32")
    assert out.returncode == 2 and "INT8 graph only" in out.stderr and "make train" in out.stderr


def test_unknown_arm_is_a_clear_error(tmp_path):
    out = _run(tmp_path, "--arms", "model,fast")
    assert out.returncode == 2 and "unknown arm" in out.stderr and "'fast'" in out.stderr
