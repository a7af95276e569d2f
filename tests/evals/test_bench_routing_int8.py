"""bench/routing_int8.py on a gate model in its training form (conftest's small_gate: the mechanics; its held-out figures need the fold models and
are the bench's): the three arms route every line at every size with the graph they name (the product's block-wise
INT8 graph, and onnxruntime's dynamic one made in a temporary copy that leaves the model alone), the report pools them with the
paired counts and latency percentiles, and the plot is written; bad flags are clear errors."""

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO


def _run(tmp_path, *extra):
    return subprocess.run([sys.executable, str(REPO / "bench" / "routing_int8.py"), "--json", str(tmp_path / "q.json"),
                           *extra], capture_output=True, text=True, timeout=600, cwd=REPO)


def test_every_arm_routes_every_line_with_its_graph(tmp_path, small_gate):
    from services.router.onnx_encoder import INT8_METHOD, int8_method

    GATE = small_gate
    assert int8_method(GATE / "query_encoder") == INT8_METHOD
    before = sorted((p.name, p.stat().st_mtime_ns) for p in (GATE / "query_encoder" / "onnx").iterdir())
    out = _run(tmp_path, "--folds", "1", "--gates", str(GATE), "--limit", "5", "--draws", "2", "--sizes", "10,all")
    assert out.returncode == 0, out.stderr[-3000:]
    rep = json.loads((tmp_path / "q.json").read_text())
    assert rep["held_out"] is False and rep["models"] == {"1": str(GATE)}
    assert set(rep["pooled"]) == {"fp32", "int8", "int8-dynamic"} and set(rep["pooled"]["int8"]) == {"10", "all"}
    for arm in ("fp32", "int8", "int8-dynamic"):
        assert rep["latency"][arm]["n"] == 5 * 2 * 2  # lines x sizes x draws
        assert 0 < rep["latency"][arm]["p50"] <= rep["latency"][arm]["p99"]
        q = rep["route_ms_quantiles"][arm]
        assert len(q) == 201 and q == sorted(q) and q[100] == pytest.approx(rep["latency"][arm]["p50"], abs=1e-3)
        assert all(rep["pooled"][arm][s]["n"] == 5 for s in ("10", "all"))
        assert rep["per_fold"]["1"]["n"] == 5 and set(rep["per_fold"]["1"]["top1"][arm]) == {"10", "all"}
    assert set(rep["paired_vs_fp32"]) == {"int8", "int8-dynamic", "int8_vs_int8-dynamic"}
    for by_size in rep["paired_vs_fp32"].values():
        for c in by_size.values():
            assert c["fixed"] + c["broken"] <= 10 and 0 < c["sign_test_p"] <= 1
    assert sorted((p.name, p.stat().st_mtime_ns) for p in (GATE / "query_encoder" / "onnx").iterdir()) == before
    assert (tmp_path / "q.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("flags, message", [
    (["--folds", "0,1", "--gates", "a"], "--gates: 1 model(s) for 2 fold(s)"),
    (["--folds", "3"], "--folds: of 0, 1, 2"),
])
def test_bad_flags_are_clear_errors(tmp_path, flags, message):
    out = _run(tmp_path, *flags)
    assert out.returncode == 2 and message in out.stderr
