"""What the resumable evaluations share: rows checkpointed one JSON line each, and the report written with its plot."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any


def load_rows(path: Path, key: Any) -> dict[str, dict[str, Any]]:
    """The rows of a checkpoint file written under ``key`` (a row of another model, code version or setting is left
    out), by ``id``; a line cut by a kill is skipped."""
    rows: dict[str, dict[str, Any]] = {}
    if path.is_file():
        for raw in path.read_text().splitlines():
            try:
                row = json.loads(raw)
            except ValueError:
                continue
            if row.get("key") == key:
                rows[row["id"]] = row
    return rows


def write_report(out_json: str | Path, report: dict[str, Any], plot: Callable[[dict[str, Any], str], None]) -> None:
    """``report`` as indented JSON, and ``plot``'s PNG beside it."""
    Path(out_json).parent.mkdir(parents=True, exist_ok=True)
    Path(out_json).write_text(json.dumps(report, indent=2) + "\n")
    plot(report, str(Path(out_json).with_suffix(".png")))
