"""CLI wiring and report shaping of the splice evals (no model: the runs themselves are reports/)."""

from __future__ import annotations

import argparse

from evals.splice_fidelity import (
    ARMS,
    add_drift_parser,
    add_fidelity_parser,
    add_ttft_parser,
    summarize_fidelity,
)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    add_fidelity_parser(sub)
    add_ttft_parser(sub)
    add_drift_parser(sub)
    return ap


def test_parsers_wire_defaults_and_flags():
    ap = _parser()
    a = ap.parse_args(["fidelity", "--json", "x.json", "--quick", "--deltas", "0,64"])
    assert a.out == "x.json" and a.quick and a.deltas == "0,64" and a.threads == 1 and callable(a.fn)
    assert ap.parse_args(["ttft"]).out == "reports/splice_ttft.json"
    assert ap.parse_args(["drift"]).out == "reports/splice_drift.json"


def test_summarize_fidelity_shape():
    rows = [{"arm": arm, "delta_pos": d, "kl": 0.0 if arm == "exact" else 0.1 * (i + 1), "top1": 1,
             "bit_identical": arm == "exact", "recompute_pct": 5.0}
            for arm in ARMS for d in (0, 64) for i in range(2)]
    out = summarize_fidelity(rows, ARMS, (0, 64))
    assert set(out) == set(ARMS)
    cell = out["bare"][1]
    assert cell["delta_pos"] == 64 and abs(cell["kl_mean"] - 0.15) < 1e-12 and abs(cell["kl_max"] - 0.2) < 1e-12
    assert cell["top1"] == 1.0 and out["exact"][0]["bit_identical"] == 1.0
