"""The CLI wiring of `nexus eval routing` and `nexus train-gate` (parsing only; the runs are the commands)."""

import argparse

from evals.cli_routing import _hp_from_args, add_routing_eval_parser, add_train_gate_parser


def _parser():
    p = argparse.ArgumentParser(prog="nexus")
    sub = p.add_subparsers(dest="cmd", required=True)
    add_routing_eval_parser(sub.add_parser("eval").add_subparsers(dest="eval_cmd", required=True))
    add_train_gate_parser(sub)
    return p


def test_eval_routing_arguments():
    a = _parser().parse_args(["eval", "routing", "--queries", "q.jsonl", "--tools", "d", "--sizes", "10,all",
                              "--json", "o.json", "--seed", "2", "--ce-epochs", "2"])
    # --folds unset: 3 per tool line (seen), 4 by server (unseen), chosen when the command runs
    assert (a.queries, a.tools, a.sizes, a.out, a.seed, a.folds) == ("q.jsonl", "d", "10,all", "o.json", 2, None)
    assert a.protocol == "seen" and a.gate_arm
    hp = _hp_from_args(a)
    assert hp.seed == 2 and hp.ce_epochs == 2 and hp.q_epochs == 3 and callable(a.fn)
    u = _parser().parse_args(["eval", "routing", "--protocol", "unseen", "--queries", "q", "--tools", "d", "--json",
                              "o.json", "--no-gate-arm", "--derived", ""])
    assert u.protocol == "unseen" and not u.gate_arm and u.derived == ""


def test_train_gate_defaults_to_the_router_config_path():
    from services.router.config import RouterConfig

    a = _parser().parse_args(["train-gate", "--queries", "q", "--tools", "t"])
    assert a.out == RouterConfig().gate_model_dir and not a.force and _hp_from_args(a).seed == 0


def test_both_commands_default_to_the_committed_calibration_lines():
    from pathlib import Path

    committed = str(Path(__file__).resolve().parents[2] / "data" / "routing_calibration")
    for argv in (["train-gate", "--queries", "q", "--tools", "t"],
                 ["eval", "routing", "--queries", "q", "--tools", "t", "--json", "o.json"]):
        assert _parser().parse_args(argv).calibration == committed
        assert _parser().parse_args([*argv, "--calibration", ""]).calibration == ""


def test_eval_routing_draws_default_to_one_and_must_be_positive(capsys):
    import pytest

    base = ["eval", "routing", "--queries", "q", "--tools", "t", "--json", "o.json"]
    assert _parser().parse_args(base).draws == 1
    assert _parser().parse_args([*base, "--draws", "3"]).draws == 3
    with pytest.raises(SystemExit):
        _parser().parse_args([*base, "--draws", "0"])
    assert "must be >= 1" in capsys.readouterr().err
