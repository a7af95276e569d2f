"""Check hand-written request lines against the tool registry (``data/routing_augment``).

    python data/check_augment.py DIR_OR_FILE [--tools data/mcp_tools] [--per-tool N] [--prefix a-]

Every line must parse, name a registry tool of its ``server``, carry a unique id, and its ``args`` must be
``inputSchema`` properties whose values validate against the schema (``required`` lifted: a request may leave
a required argument open). ``history`` turns are ``{"role": user|assistant|tool, "content": str}``.
``--per-tool N`` also checks that every tool of the servers present has exactly N lines.

It also lists *uncopied* string values: a string argument that is not an enum value and does not occur in the
query or history text (case-insensitive). Those are fine when the user's wording is mapped (``Tokyo`` ->
``Asia/Tokyo``), but they are worth a second look. Exit status 1 on any error, 0 otherwise.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

import jsonschema

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: run as a script from anywhere
from training.data import load_registry as load_tools  # noqa: E402

ROLES = {"user", "assistant", "tool"}
FIELDS = {"id", "server", "tool", "query", "args", "history"}


def load_registry(tools_dir: Path) -> dict[str, dict[str, dict]]:
    """server -> tool name -> inputSchema (the evaluation's registry loader, grouped by server)."""
    reg = load_tools(tools_dir)
    out: dict[str, dict[str, dict]] = {}
    for t in reg.tools:
        out.setdefault(reg.server_of[t.name], {})[t.name] = t.input_schema or {"type": "object"}
    return out


def _lifted(schema: dict) -> dict:
    s = dict(schema)
    s.pop("required", None)
    return s


def _enum_values(schema: dict) -> set[str]:
    vals: set[str] = set()
    stack = [schema]
    while stack:
        s = stack.pop()
        if isinstance(s, dict):
            vals.update(v for v in s.get("enum", ()) if isinstance(v, str))
            stack.extend(v for v in s.values() if isinstance(v, (dict, list)))
        elif isinstance(s, list):
            stack.extend(s)
    return vals


def _strings(value) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    return []


def check_lines(files: list[Path], registry: dict[str, dict[str, dict]], per_tool: int = 0,
                prefix: str = "") -> tuple[list[str], list[str], Counter]:
    errors: list[str] = []
    uncopied: list[str] = []
    ids: Counter = Counter()
    per: Counter = Counter()
    servers: set[str] = set()
    for f in files:
        for n, raw in enumerate(f.read_text().splitlines(), 1):
            where = f"{f.name}:{n}"
            if not raw.strip():
                errors.append(f"{where}: empty line")
                continue
            try:
                d = json.loads(raw)
            except json.JSONDecodeError as e:
                errors.append(f"{where}: not JSON ({e})")
                continue
            if not isinstance(d, dict) or set(d) != FIELDS:
                errors.append(f"{where}: fields must be exactly {sorted(FIELDS)}")
                continue
            ids[d["id"]] += 1
            if prefix and not str(d["id"]).startswith(prefix):
                errors.append(f"{where}: id {d['id']!r} does not start with {prefix!r}")
            tools = registry.get(d["server"])
            if tools is None:
                errors.append(f"{where}: unknown server {d['server']!r}")
                continue
            servers.add(d["server"])
            schema = tools.get(d["tool"])
            if schema is None:
                errors.append(f"{where}: {d['tool']!r} is not a tool of {d['server']}")
                continue
            per[d["tool"]] += 1
            if not isinstance(d["query"], str) or not d["query"].strip():
                errors.append(f"{where}: empty query")
            hist = d["history"]
            if not isinstance(hist, list) or not all(
                    isinstance(t, dict) and set(t) == {"role", "content"} and t["role"] in ROLES
                    and isinstance(t["content"], str) and t["content"].strip() for t in hist):
                errors.append(f"{where}: history must be a list of {{role: user|assistant|tool, content}}")
                hist = []
            args = d["args"]
            if not isinstance(args, dict):
                errors.append(f"{where}: args must be an object")
                continue
            props = schema.get("properties") or {}
            extra = sorted(set(args) - set(props))
            if extra:
                errors.append(f"{where}: args {extra} are not properties of {d['tool']}")
                continue
            try:
                jsonschema.validate(args, _lifted(schema))
            except jsonschema.ValidationError as e:
                errors.append(f"{where}: args do not validate: {e.message}")
                continue
            text = " ".join([d["query"]] + [t["content"] for t in hist]).lower()
            for key, value in args.items():
                enums = _enum_values(props.get(key, {}))
                for s in _strings(value):
                    if s not in enums and s.strip().lower() not in text:
                        uncopied.append(f"{where}: {d['tool']}.{key} = {s!r}")
    for i, c in ids.items():
        if c > 1:
            errors.append(f"id {i!r} used {c} times")
    if per_tool:
        for server in sorted(servers):
            for tool in registry[server]:
                if per[tool] != per_tool:
                    errors.append(f"{server}/{tool}: {per[tool]} lines, expected {per_tool}")
    return errors, uncopied, per


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("path", help="a .jsonl file or a directory of them")
    ap.add_argument("--tools", default=str(Path(__file__).resolve().parent / "mcp_tools"))
    ap.add_argument("--per-tool", type=int, default=0, help="expected lines per tool of each server present")
    ap.add_argument("--prefix", default="", help="every id starts with this")
    a = ap.parse_args(argv)
    root = Path(a.path)
    files = [root] if root.is_file() else sorted(root.glob("*.jsonl"))
    if not files:
        print(f"no .jsonl files at {root}", file=sys.stderr)
        return 1
    errors, uncopied, per = check_lines(files, load_registry(Path(a.tools)), a.per_tool, a.prefix)
    for u in uncopied:
        print(f"uncopied (check it is a mapped value): {u}")
    for e in errors:
        print(f"ERROR {e}")
    print(f"{sum(per.values())} lines, {len(per)} tools, {len(errors)} errors, {len(uncopied)} uncopied strings")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
