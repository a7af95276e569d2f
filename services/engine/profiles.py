"""Model profiles: which hand-written decoding rules a model family runs, chosen from its GGUF's metadata.

The engine's decoding rules (``RULES``: the copy bias's terms, the slot reader's hints, enum choices) were written
for SmolLM2-135M, and a rule that helps one model can cost another. Each rule's worth is measured per model by
``nexus eval rules`` (evals/rules.py: the rule off alone vs all on, paired per argument on held-out lines, a sign
test); a family's profile turns off the rules whose row did not pay for it and cites the report. A family without
a measured profile runs every rule its configuration enables.

The profile only ever turns rules off: the configuration still decides the rest (a rule the configuration turns
off stays off), and ``profile = "none"`` runs exactly what the configuration says."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any


@dataclass(frozen=True)
class Rule:
    name: str
    off: dict[str, Any]  # the EngineConfig values that turn the rule off
    what: str


RULES: tuple[Rule, ...] = (
    Rule("copy bias", {"copy_bias": False}, "the whole copy bias (every rule below but enum choices rides on it)"),
    Rule("start bias", {"copy_start_bias": 0.0}, "a value starts on a word of the request"),
    Rule("close bias", {"copy_close_bias": 0.0}, "a value closes where its span ends"),
    Rule("span penalty", {"copy_span_penalty": 0.0}, "a copied value does not leave its span mid-word"),
    Rule("reuse penalty", {"copy_reuse_penalty": 0.0}, "two values do not start at the same place"),
    Rule("word penalty", {"copy_word_penalty": 0.0}, "a value does not run onto the next unquoted word"),
    Rule("slot reader", {"slot_hint_bias": 0.0}, "the trained slot reader's spans (and what rides on them: "
         "pending keys, hint penalty, enum choices)"),
    Rule("pending keys", {"slot_pending_bias": 0.0}, "the object does not close before a hinted value"),
    Rule("hint penalty", {"slot_hint_penalty": 0.0}, "a hinted value stays on its span"),
    Rule("enum choices", {"enum_choices": False}, "an enum or boolean the request names in words"),
)
RULES_BY_NAME = {r.name: r for r in RULES}


def rule_is_on(rule: Rule, config: Any) -> bool:
    """Whether ``config`` runs the rule (turning it off would change something)."""
    return any(getattr(config, k) != v for k, v in rule.off.items())


def off_values(rules: Sequence[str]) -> dict[str, Any]:
    """The config values that turn ``rules`` (names of ``RULES``) off, all at once."""
    off: dict[str, Any] = {}
    for name in rules:
        off.update(RULES_BY_NAME[name].off)
    return off


def without(config: Any, rules: Sequence[str]) -> Any:
    """``config`` with ``rules`` (names of ``RULES``) turned off."""
    return replace(config, **off_values(rules))


@dataclass(frozen=True)
class Profile:
    family: str
    off: tuple[str, ...] = ()  # rules this family runs without
    evidence: str = ""  # the report the choice comes from ("" = not measured: every configured rule runs)


PROFILES: dict[str, Profile] = {
    # every rule left here runs (reports/rules_smollm2-135m.json, 120 held-out lines, 237 arguments: the copy bias
    # +114 / -6 and the slot reader +76 / -7 alone, the small terms +13 / -3 together)
    "smollm2": Profile("smollm2", (), "reports/rules_smollm2-135m.json"),
    # Qwen2.5-Coder-0.5B and -1.5B write the stated values themselves: no rule pays (reports/rules_qwen2.5-coder-0.5b.json,
    # 40 held-out lines, 84 arguments: the whole copy bias +6 / -8, the slot reader +7 / -6, no other rule gains more
    # than 2; reports/rules_qwen2.5-coder-1.5b.json, the same lines: copy bias +4 / -4, slot reader +5 / -5), so none
    # runs, and the slot reader is not loaded
    "qwen2": Profile("qwen2", tuple(r.name for r in RULES), "reports/rules_qwen2.5-coder-0.5b.json"),
    # an unmeasured family runs every rule its configuration enables
    "default": Profile("default"),
}


def family_of(metadata: dict[str, str]) -> str:
    """The model family of a GGUF's metadata: ``smollm2``, ``qwen2`` or ``default``."""
    name = " ".join(str(metadata.get(k, "")) for k in ("general.name", "general.basename")).lower()
    arch = str(metadata.get("general.architecture", "")).lower()
    if "smollm2" in name.replace(" ", "").replace("-", ""):
        return "smollm2"
    if arch == "qwen2":
        return "qwen2"
    return "default"


def profile_for(metadata: dict[str, str], choice: str = "auto") -> Profile:
    """The profile an engine runs: ``choice`` "auto" (the family's, from the metadata), "none" (the configuration
    alone), or a family name."""
    if choice == "none":
        return Profile("none")
    family = family_of(metadata) if choice == "auto" else choice
    if choice != "auto" and family not in PROFILES:
        raise ValueError(f"unknown model profile {choice!r}; known: auto, none, {', '.join(sorted(PROFILES))}")
    return PROFILES.get(family, replace(PROFILES["default"], family=family))
