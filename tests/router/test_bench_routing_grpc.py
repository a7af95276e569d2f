"""bench/routing_grpc.py against real router processes (a few requests; latency figures are the bench's, not
asserted here): the arms answer every request, only the model arm loads exemplar keys and the argument-evidence
stage, the plot is written."""

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO

GATE = REPO / "var" / "models" / "gate"
LATE = REPO / "var" / "models" / "late_reader"


def _run(tmp_path, *extra):
    return subprocess.run([sys.executable, str(REPO / "bench" / "routing_grpc.py"), "--tools",
                           str(REPO / "data" / "mcp_tools"), "--queries", str(REPO / "data" / "queries" / "train.jsonl"),
                           "--gate", str(GATE), "--json", str(tmp_path / "rg.json"), *extra],
                          capture_output=True, text=True, timeout=900, cwd=REPO)


@pytest.fixture(scope="module")
def every_arm(tmp_path_factory):
    """One run with every arm side by side (a router process each, started once for all the tests below). The late
    arm's reader is calibrated to escalate everything (tau above any margin; untrained, the mechanics only)."""
    from tests.router.test_late_reader import write_late_reader

    if not (GATE / "gate.json").is_file():
        pytest.fail("no gate model at var/models/gate: run `make setup` (it trains and links it)")
    tmp = tmp_path_factory.mktemp("routing-grpc")
    late = write_late_reader(tmp / "late_reader", GATE, section={"feature": "req_min", "alpha": 1.0, "tau": 1e9,
                                                                 "top_k": 4})
    if not (LATE / "late_reader.json").is_file():
        pytest.fail("no late reader at var/models/late_reader: run `make setup` (it trains and links it)")
    out = _run(tmp, "--limit", "6", "--repeats", "2", "--arms", "model,off,text,staged,fp32,late",
               "--late-reader", str(late))
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads((tmp / "rg.json").read_text()), late, tmp


def test_arms_run_side_by_side_over_grpc(every_arm):
    rep, _, tmp = every_arm
    doc = json.loads((GATE / "gate.json").read_text())
    assert rep["registry_size"] == 338
    assert set(rep["arms"]) == {"model", "off", "text", "staged", "fp32", "late"}
    for arm in rep["arms"].values():
        assert arm["n_requests"] == 12 and arm["rtt_ms_p50"] > 0 and arm["rtt_ms_p99"] >= arm["rtt_ms_p50"]
    assert rep["arms"]["model"]["exemplar_keys_loaded"] == (doc["slb"]["exemplar_weight"] > 0)
    assert not rep["arms"]["text"]["exemplar_keys_loaded"]
    # the slot reader's stage only when the gate model holds a calibration for it (`nexus train-gate --slots`)
    staged = (doc.get("arg_evidence") or {}).get("feature", "none") != "none" and doc["alpha"] <= 0
    assert rep["arms"]["staged"]["argument_evidence_loaded"] == staged and rep["arms"]["staged"]["exemplar_keys_loaded"]
    assert not rep["arms"]["off"]["argument_evidence_loaded"] and not rep["arms"]["text"]["argument_evidence_loaded"]
    assert rep["arms"]["off"]["escalation_rate"] == rep["arms"]["text"]["escalation_rate"] == 0.0
    assert rep["p50_ratio_model_over_text"] > 0 and (tmp / "rg.png").stat().st_size > 10_000
    assert 0.0 <= rep["same_tool_model_and_text"] <= 1.0 and 0.0 <= rep["same_tool_model_and_off"] <= 1.0


def test_the_default_router_routes_through_the_production_late_reader_over_grpc(every_arm):
    """A router process started with the default config loads the argument-evidence stage with the late reader `make
    setup` trained (var/models/late_reader) and the calibration it carries; with the stage off it never escalates."""
    rep, _, _ = every_arm
    arms = rep["arms"]
    section = json.loads((LATE / "late_reader.json").read_text())["arg_evidence"]
    assert section["feature"] != "none", "make setup's late reader found no feature that gains: the stage is off"
    assert arms["model"]["argument_evidence_loaded"]
    assert arms["fp32"]["argument_evidence_loaded"]  # at fp32 the reader's fp32 graph embeds
    assert rep["arm_env"]["model"] == {}
    assert 0.0 <= arms["model"]["escalation_rate"] <= 1.0 and not arms["off"]["argument_evidence_loaded"]


def test_the_late_arm_escalates_through_the_late_reader_over_grpc(every_arm):
    """The real router process loads the late reader and every Route goes through it."""
    rep, late, _ = every_arm
    arms = rep["arms"]
    assert arms["late"]["argument_evidence_loaded"] and arms["late"]["escalation_rate"] == 1.0
    assert arms["late"]["n_requests"] == arms["model"]["n_requests"] == 12
    assert rep["arm_env"]["late"]["NEXUS_ROUTER_LATE_READER_DIR"] == str(late)


def test_the_default_embeds_with_the_int8_graph_and_fp32_is_an_arm_over_grpc(every_arm):
    """A real router process with the default config embeds with an INT8 graph (make setup writes the gate model's
    and the late reader's); NEXUS_ROUTER_QUERY_ENCODER_PRECISION=fp32 loads the fp32 one; both answer every
    request."""
    rep, _, _ = every_arm
    arms = rep["arms"]
    assert arms["model"]["query_encoder_backend"] == arms["off"]["query_encoder_backend"] == "onnxruntime-int8"
    assert arms["fp32"]["query_encoder_backend"] == "onnxruntime"
    assert arms["model"]["n_requests"] == arms["fp32"]["n_requests"] == 12
    assert arms["model"]["exemplar_keys_loaded"]
    assert rep["arm_env"]["fp32"] == {"NEXUS_ROUTER_QUERY_ENCODER_PRECISION": "fp32"}


def test_unknown_arm_is_a_clear_error(tmp_path):
    out = _run(tmp_path, "--arms", "model,fast")
    assert out.returncode == 2 and "unknown arm" in out.stderr and "'fast'" in out.stderr
