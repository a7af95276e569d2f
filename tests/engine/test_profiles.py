"""Model profiles: the family from the GGUF's metadata, and the rules its profile turns off in the engine."""

from dataclasses import replace

import pytest

from services.common.store import LocalStore
from services.engine import profiles as P
from services.engine.config import EngineConfig


def test_families_from_metadata():
    assert P.family_of({"general.architecture": "llama", "general.name": "SmolLM2 135M Instruct"}) == "smollm2"
    assert P.family_of({"general.architecture": "llama", "general.basename": "SmolLM2"}) == "smollm2"
    assert P.family_of({"general.architecture": "qwen2", "general.name": "Qwen2.5 Coder 0.5B Instruct"}) == "qwen2"
    assert P.family_of({"general.architecture": "gemma3"}) == "default" and P.family_of({}) == "default"


def test_measured_profiles_cite_their_report_and_qwen_runs_no_rule():
    qwen = P.profile_for({"general.architecture": "qwen2"})
    off = P.without(EngineConfig(), qwen.off)
    assert qwen.evidence.startswith("reports/rules_qwen") and not off.copy_bias and not off.slot_hint_bias
    assert not any(P.rule_is_on(r, off) for r in P.RULES)
    assert P.profile_for({"general.name": "SmolLM2 135M"}).off == ()
    from pathlib import Path
    root = Path(__file__).resolve().parents[2]
    assert all((root / p.evidence).is_file() for p in P.PROFILES.values() if p.evidence)


def test_profile_choice():
    assert P.profile_for({}, "none").off == () and P.profile_for({}, "none").family == "none"
    assert P.profile_for({"general.architecture": "gemma3"}).family == "default"
    with pytest.raises(ValueError, match="unknown model profile"):
        P.profile_for({}, "gpt-9")


def test_every_rule_names_real_config_values_and_turning_rules_off_does_only_that():
    cfg = EngineConfig()
    assert all(hasattr(cfg, k) for r in P.RULES for k in r.off)
    assert all(P.rule_is_on(r, cfg) for r in P.RULES)  # the defaults run every rule
    off = P.without(cfg, ["reuse penalty", "enum choices"])
    assert off.copy_reuse_penalty == 0 and off.enum_choices is False
    assert replace(off, copy_reuse_penalty=cfg.copy_reuse_penalty, enum_choices=True) == cfg


def test_the_engine_runs_its_familys_profile_and_none_runs_the_configuration(tmp_path, monkeypatch):
    from services.engine.engine import Engine

    store = LocalStore(tmp_path / "s")
    monkeypatch.setitem(P.PROFILES, "smollm2", P.Profile("smollm2", ("reuse penalty",), "a report"))
    eng = Engine(EngineConfig(store_url=str(store.root)), store)  # the default GGUF: SmolLM2-135M-Instruct
    try:
        assert eng.profile.family == "smollm2" and eng.config.copy_reuse_penalty == 0
        assert eng.config.copy_span_penalty == EngineConfig().copy_span_penalty  # the others untouched
    finally:
        eng.close()
    eng = Engine(EngineConfig(store_url=str(store.root), profile="none"), store)
    try:
        assert eng.profile.family == "none" and eng.config.copy_reuse_penalty == EngineConfig().copy_reuse_penalty
    finally:
        eng.close()
