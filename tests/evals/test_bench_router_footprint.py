"""bench/router_footprint.py on the shipped models (one fresh router process; its figures are the bench's): the
report says the process loaded the gate model, what it peaked at, and the plot is
written; a missing model directory is a clear error."""

import json
import subprocess
import sys

from tests.conftest import REPO


def _run(tmp_path, *extra):
    return subprocess.run([sys.executable, str(REPO / "bench" / "router_footprint.py"), "--json",
                           str(tmp_path / "fp.json"), *extra], capture_output=True, text=True, timeout=900, cwd=REPO)


def test_a_router_started_on_the_shipped_models_loads_them(tmp_path):
    out = _run(tmp_path, "--repeats", "1")
    assert out.returncode == 0, out.stderr[-3000:]
    rep = json.loads((tmp_path / "fp.json").read_text())
    arm = rep["arms"]["shipped"]
    assert set(rep["arms"]) == {"shipped"} and len(arm["runs"]) == 1
    assert arm["gate_loaded"]
    assert arm["cold_start_s_median"] > 0 and arm["max_rss_mb_median"] > 100
    assert (tmp_path / "fp.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_missing_model_directory_is_a_clear_error(tmp_path):
    out = _run(tmp_path, "--training", str(tmp_path / "nowhere"))
    assert out.returncode == 2 and "--training: no" in out.stderr and "gate.json" in out.stderr
