"""bench/routing_metatool.py: MetaTool's plugins as unseen tools. One request a plugin with the base encoder: every
plugin is scored, the rates are rates, the plot is written; a directory that is not an encoder is a clear error."""

import json
import subprocess
import sys

from tests.conftest import REPO


def test_the_probe_scores_every_plugin_and_writes_its_report(tmp_path):
    from services.common.models import default_embedder_path

    out = subprocess.run([sys.executable, str(REPO / "bench" / "routing_metatool.py"), "--per-tool", "1",
                          "--encoder", f"base={default_embedder_path()}", "--json", str(tmp_path / "m.json")],
                         capture_output=True, text=True, timeout=300, cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    rep = json.loads((tmp_path / "m.json").read_text())
    assert rep["tools"] == 199 and rep["requests"] == 199 and set(rep["arms"]) == {"base"}
    a = rep["arms"]["base"]
    assert 0.3 < a["top1"] <= a["top3"] <= 1 and a["top1_bootstrap95"][0] <= a["top1"] <= a["top1_bootstrap95"][1]
    assert (tmp_path / "m.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    bad = subprocess.run([sys.executable, str(REPO / "bench" / "routing_metatool.py"), "--encoder", f"x={tmp_path}"],
                         capture_output=True, text=True, timeout=120, cwd=REPO)
    assert bad.returncode == 2 and "not a sentence-transformers directory" in bad.stderr
