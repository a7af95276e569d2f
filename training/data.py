"""Routing data: query lines, their per-tool slot, equivalence groups and per-query registries.

The query file (``data/queries/train.jsonl``) holds ~3 lines per tool in registry order. A line's
*slot* is its index among its tool's lines (0 = worded close to the description, 1 = paraphrase,
2 = terse / multi-turn); folds are made by slot so every tool keeps its other lines for training.
"""

from __future__ import annotations

import json
import os
import random
import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from services.common.errors import InvalidArgument
from services.common.tools import Tool, parse_tool

# Tools that duplicate each other exactly (data/queries/README.md): a query written for one of them is
# correctly routed to any member of its group.
EQUIVALENCE_GROUPS: tuple[frozenset[str], ...] = (
    frozenset({"read_file", "read_text_file"}),
    frozenset({"add_comment_to_pending_review", "add_pull_request_review_comment"}),
    frozenset({"pull_request_review_write", "github_create_pull_request_review", "submit_pending_pull_request_review",
               "delete_pending_pull_request_review", "resolve_review_thread", "unresolve_review_thread"}),
    frozenset({"sub_issue_write", "add_sub_issue", "remove_sub_issue", "reprioritize_sub_issue"}),
)


def equivalents(tool: str) -> frozenset[str]:
    """The tools that count as a correct answer for a query labelled ``tool`` (itself included)."""
    for g in EQUIVALENCE_GROUPS:
        if tool in g:
            return g
    return frozenset({tool})


def is_correct(predicted: str, label: str) -> bool:
    return predicted in equivalents(label)


@dataclass(frozen=True)
class QueryLine:
    id: str
    server: str
    tool: str
    query: str
    args: dict[str, Any] = field(default_factory=dict)
    history: tuple[tuple[str, str], ...] = ()
    slot: int = 0

    @property
    def history_dicts(self) -> list[dict[str, str]]:
        return [{"role": r, "content": c} for r, c in self.history]


def load_queries(path: str | Path) -> list[QueryLine]:
    """Read a query file (``{"id","tool","query","args","history"}`` per line; ``server`` optional)."""
    p = Path(path)
    if not p.is_file():
        raise InvalidArgument(f"query file not found: {path}")
    lines: list[QueryLine] = []
    per_tool: dict[str, int] = defaultdict(int)
    for n, raw in enumerate(p.read_text().splitlines(), 1):
        if not raw.strip():
            continue
        try:
            d = json.loads(raw)
        except json.JSONDecodeError as e:
            raise InvalidArgument(f"{path}:{n}: not JSON: {e.msg}") from e
        for key in ("tool", "query"):
            if not isinstance(d.get(key), str) or not d[key]:
                raise InvalidArgument(f"{path}:{n}: missing {key!r}")
        hist = tuple((str(t.get("role", "")), str(t.get("content", ""))) for t in d.get("history") or [])
        slot = per_tool[d["tool"]]
        per_tool[d["tool"]] += 1
        lines.append(QueryLine(id=str(d.get("id", f"line-{n}")), server=str(d.get("server", "")), tool=d["tool"],
                               query=d["query"], args=d.get("args") or {}, history=hist, slot=slot))
    return lines


@dataclass(frozen=True)
class Registry:
    """The tools of a registry directory in file order, with the server each came from."""

    tools: tuple[Tool, ...]
    server_of: dict[str, str]

    @property
    def names(self) -> list[str]:
        return [t.name for t in self.tools]

    def by_name(self) -> dict[str, Tool]:
        return {t.name: t for t in self.tools}

    def servers(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = defaultdict(list)
        for t in self.tools:
            out[self.server_of[t.name]].append(t.name)
        return dict(out)

    def subset(self, names: Iterable[str]) -> Registry:
        keep = set(names)
        return Registry(tuple(t for t in self.tools if t.name in keep),
                        {n: s for n, s in self.server_of.items() if n in keep})


def load_registry(path: str | Path) -> Registry:
    """Load ``{"server", "tools": [...]}`` files (like ``data/mcp_tools``), keeping each tool's server."""
    root = Path(path)
    if not root.is_dir():
        raise InvalidArgument(f"tool directory not found: {path}")
    tools: list[Tool] = []
    server_of: dict[str, str] = {}
    for f in sorted(root.glob("*.json")):
        data = json.loads(f.read_text())
        items = data.get("tools", []) if isinstance(data, dict) else data
        default_server = data.get("server", f.stem) if isinstance(data, dict) else f.stem
        for item in items:
            tool = parse_tool(item)
            if tool.name in server_of:
                raise InvalidArgument(f"duplicate tool name {tool.name!r} in {f}")
            server_of[tool.name] = str(item.get("server", default_server)) if isinstance(item, dict) else default_server
            tools.append(tool)
    return Registry(tuple(tools), server_of)


def parse_sizes(text: str) -> list[str]:
    """``"10,50,all"`` -> ``["10", "50", "all"]`` (validated; keys stay as given)."""
    out: list[str] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if part != "all" and (not part.isdigit() or int(part) < 2):
            raise InvalidArgument(f"size {part!r} must be an integer >= 2 or 'all'")
        out.append(part)
    if not out:
        raise InvalidArgument("no sizes given")
    return out


def query_registry(target: str, size: str | int, registry: Registry, rng: random.Random,
                   exclude: Sequence[str] = ()) -> list[str]:
    """The registry one query is routed over: its target plus ``N-1`` distractors, the target's own server
    first (its nearest confusions, drawn at random when the server alone exceeds ``N-1``), then tools of
    other servers drawn at random. ``"all"`` (or N >= the registry) is the whole registry."""
    pool = [n for n in registry.names if n not in set(exclude) or n == target]
    if size == "all" or int(size) >= len(pool):
        return list(pool)
    n = int(size)
    server = registry.server_of[target]
    same = [t for t in pool if t != target and registry.server_of[t] == server]
    other = [t for t in pool if t != target and registry.server_of[t] != server]
    if len(same) >= n - 1:
        picked = rng.sample(same, n - 1)
    else:
        picked = same + rng.sample(other, n - 1 - len(same))
    return [target, *picked]


def assign_folds(lines: Sequence[QueryLine], k: int = 3, seed: int = 0) -> list[int]:
    """A fold per line: each tool's slots 0..k-1 are mapped to folds by a seeded permutation, so every fold
    holds at most one line per tool (the others stay in training) and mixes the slots' wording styles."""
    tools = sorted({ln.tool for ln in lines})
    rng = random.Random(seed)
    perm = {t: rng.sample(range(k), k) for t in tools}
    return [perm[ln.tool][ln.slot % k] for ln in lines]


def prepare_training_env() -> None:
    """Before torch starts: idle OpenMP workers must yield on shared cores (spinning made 2-thread
    inference ~20x slower here while other jobs ran), and nothing may reach for a hub."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def jsonl_files(path: str | Path) -> list[Path]:
    """The files of a JSONL file or a directory of them (sorted; '' = none)."""
    if not path:
        return []
    root = Path(path)
    if root.is_file():
        return [root]
    if not root.is_dir():
        raise FileNotFoundError(f"augment data {root} does not exist")
    return sorted(root.glob("*.jsonl"))


def load_augment(path: str | Path) -> list[QueryLine]:
    """Fit-only training lines (``data/routing_augment/*.jsonl``: requests written from the tool schemas
    alone, never from the evaluation's query file). '' means none."""
    return [ln for f in jsonl_files(path) for ln in load_queries(f)]


def tune_split(lines: Sequence[QueryLine]) -> tuple[list[QueryLine], list[QueryLine]]:
    """A fixed, disjoint split of the query lines: ``tune`` (every 4th line by id number) is where prompt,
    IR and decoding choices were tuned; ``heldout`` (the other lines) is where the reported figures come from."""
    def num(ln: QueryLine) -> int:
        digits = re.sub(r"\D", "", ln.id)
        return int(digits) if digits else hash(ln.id)
    tune = [ln for ln in lines if num(ln) % 4 == 0]
    return tune, [ln for ln in lines if num(ln) % 4 != 0]
