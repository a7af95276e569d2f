"""Synthetic routing requests generated from tool schemas alone (no query line is read).

For every tool a few pseudo-requests in the styles users write — the description's first sentence as an
imperative, a question, a terse "name + values" line, and a first-person request naming the required
parameters with plausible values. They give the query-encoder fine-tune an example for every registered
tool (also the ones without a real training line) and more wordings per tool. Deterministic for a seed.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence

from services.common.tools import Tool

# Plausible values by parameter name (lower-cased, without ``_`` / ``-``).
VALUES: dict[str, tuple[str, ...]] = {
    "owner": ("acme-corp", "octo-org", "torvalds", "hashicorp"),
    "repo": ("web-app", "billing-service", "linux", "terraform"),
    "path": ("src/main.py", "README.md", "docs/index.md", "/tmp/report.txt"),
    "repopath": ("/srv/app", "~/code/api", "/home/dev/infra"),
    "branch": ("main", "feature-x", "release/1.2"),
    "namespace": ("default", "kube-system", "prod"),
    "name": ("web-frontend", "api-gateway", "nginx", "payments"),
    "query": ("'rate limiting'", "'memory leak in worker'", "'oauth callback'"),
    "q": ("'flaky test'", "'deprecated API'"),
    "url": ("https://example.com/docs", "https://news.ycombinator.com"),
    "title": ("'Fix login timeout'", "'Add dark mode'"),
    "body": ("'looks good to me'", "'please rebase on main'"),
    "content": ("'hello world'", "'update the install docs'"),
    "message": ("'hello team'", "'deploy finished'"),
    "text": ("'Submit'", "'hello'"),
    "commitmessage": ("'fix typo'", "'bump version'"),
    "sha": ("a1b2c3d", "9f8e7d6"),
    "ref": ("v1.2.0", "main"),
    "tag": ("v1.6.0", "v2.0.1"),
    "channelid": ("C024BE91L", "C0PROJ42"),
    "userid": ("U12345", "U98AB"),
    "element": ("'Sign in button'", "'search box'"),
    "selector": ("'#submit'", "'.nav a'"),
    "key": ("'session:42'", "'cache:user:7'"),
    "location": ("'Paris'", "'Tokyo'"),
    "timezone": ("Europe/Berlin", "Asia/Tokyo"),
    "sql": ("'SELECT * FROM users LIMIT 5'",),
    "kind": ("Deployment", "Pod", "Service"),
    "resourcetype": ("pods", "deployments"),
    "container": ("app", "sidecar"),
    "state": ("open", "closed"),
    "labels": ("bug", "enhancement"),
    "head": ("feature-x",),
    "base": ("main",),
    "organization": ("acme-corp",),
    "org": ("acme-corp",),
    "username": ("octocat",),
    "team": ("platform",),
    "entityname": ("'Alice'",),
}
NUMERIC_HINTS = ("number", "id", "count", "limit", "page", "max", "tail", "line", "size", "n")

TEMPLATES = (
    "{sentence}{with_values}",
    "can you {sentence_lc}{with_values}?",
    "{name_words} {values}",
    "I need to {name_words}{with_values}",
    "please {sentence_lc}",
    "{values_first}: {name_words}",
)


def _norm(p: str) -> str:
    return re.sub(r"[^a-z0-9]", "", p.lower())


def _words(name: str) -> str:
    s = re.sub(r"([a-z])([A-Z])", r"\1 \2", name)
    return re.sub(r"[_\-\s]+", " ", s).strip().lower()


def first_sentence(desc: str, max_words: int = 20) -> str:
    d = re.sub(r"\s+", " ", desc or "").strip()
    first = re.split(r"(?<=[.!?])\s", d, maxsplit=1)[0].rstrip(".!? ")
    return " ".join(first.split(" ")[:max_words])


def _value(param: str, spec: object, rng: random.Random) -> str | None:
    spec = spec if isinstance(spec, dict) else {}
    enum = spec.get("enum")
    if isinstance(enum, list) and enum:
        return str(rng.choice(enum))
    n = _norm(param)
    if n in VALUES:
        return rng.choice(VALUES[n])
    typ = spec.get("type")
    if typ in ("number", "integer") or (typ is None and n.endswith(NUMERIC_HINTS)):
        return str(rng.randint(2, 99))
    if typ in ("boolean", "array", "object"):
        return None
    for k, vals in VALUES.items():
        if n.endswith(k) and len(k) > 2:
            return rng.choice(vals)
    return None


def synth_queries(tool: Tool, n: int, rng: random.Random) -> list[str]:
    """``n`` pseudo-requests for ``tool`` (distinct when possible), from its name, description and schema."""
    props = tool.input_schema.get("properties") or {}
    required = [p for p in (tool.input_schema.get("required") or []) if p in props]
    optional = [p for p in props if p not in required]
    name_words = _words(tool.name)
    sentence = first_sentence(tool.description) or name_words
    out: list[str] = []
    templates = list(TEMPLATES)
    rng.shuffle(templates)
    for i in range(n):
        params = required + rng.sample(optional, min(len(optional), rng.randint(0, 1)))
        vals = [(p, v) for p in params if (v := _value(p, props[p], rng)) is not None]
        values = " ".join(v for _, v in vals)
        with_values = (" — " + ", ".join(f"{_words(p)} {v}" for p, v in vals)) if vals else ""
        tpl = templates[i % len(templates)]
        text = tpl.format(sentence=sentence, sentence_lc=sentence[:1].lower() + sentence[1:], name_words=name_words,
                          values=values, with_values=with_values, values_first=values or name_words)
        text = re.sub(r"\s+", " ", text).strip()
        if text not in out:
            out.append(text)
    return out


def synth_examples(tools: Sequence[Tool], per_tool: int, seed: int) -> list[tuple[str, str]]:
    """``(tool name, text)`` pairs, ``per_tool`` per tool, in registry order; seeded."""
    rng = random.Random(seed * 7919 + 17)
    out = []
    for t in sorted(tools, key=lambda t: t.name):
        out.extend((t.name, q) for q in synth_queries(t, per_tool, rng))
    return out
