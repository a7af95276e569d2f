"""The trained models that ship in models/ (models/manifest.json): check them and link them where services look.

    python scripts/models.py verify [--link var/models]

``verify`` checks every file of every shipped model against the manifest (size and sha256) and fails, naming each
file, on any difference or a file the manifest does not list; ``--link DIR`` then points ``DIR/<model>`` at
``models/<model>`` (what ``make setup`` does: it trains nothing). ``make train`` rebuilds the models and their manifest
(``training/ship.py``). Standard library only: it runs before anything is installed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODELS = REPO / "models"
MANIFEST = MODELS / "manifest.json"
FORMAT = "nexus-models-v1"


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def load_manifest(path: Path = MANIFEST) -> dict:
    doc = json.loads(path.read_text())
    if doc.get("format") != FORMAT:
        raise ValueError(f"{path}: format {doc.get('format')!r}, expected {FORMAT!r}")
    return doc


def problems(root: Path = MODELS, manifest: dict | None = None) -> list[str]:
    """What is wrong with the shipped models under ``root``: missing, resized, changed or unlisted files."""
    doc = manifest if manifest is not None else load_manifest(root / "manifest.json")
    out = []
    for name, model in doc["models"].items():
        base = root / name
        listed = set(model["files"])
        for rel, want in sorted(model["files"].items()):
            p = base / rel
            if not p.is_file():
                out.append(f"{name}/{rel}: missing")
            elif p.stat().st_size != want["size"]:
                out.append(f"{name}/{rel}: {p.stat().st_size} bytes, the manifest says {want['size']}")
            elif sha256(p) != want["sha256"]:
                out.append(f"{name}/{rel}: sha256 differs from the manifest's")
        if base.is_dir():
            out += [f"{name}/{p.relative_to(base)}: not in the manifest" for p in sorted(base.rglob("*"))
                    if p.is_file() and str(p.relative_to(base)) not in listed]
    return out


def link(dest: Path, root: Path = MODELS, manifest: dict | None = None) -> list[Path]:
    """``dest/<model>`` -> ``root/<model>`` for every shipped model (a relative link: the clone can move)."""
    doc = manifest if manifest is not None else load_manifest(root / "manifest.json")
    dest.mkdir(parents=True, exist_ok=True)
    made = []
    for name in doc["models"]:
        target = Path(os.path.relpath(root / name, dest))
        lnk = dest / name
        if lnk.is_symlink() or lnk.is_file():
            lnk.unlink()
        elif lnk.is_dir():
            raise SystemExit(f"{lnk} is a directory, not a link: move it away (models are linked from {root})")
        lnk.symlink_to(target, target_is_directory=True)
        made.append(lnk)
    return made


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="scripts/models.py", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    v = sub.add_parser("verify", help="check the shipped models against models/manifest.json")
    v.add_argument("--root", default=str(MODELS))
    v.add_argument("--link", default="", help="then link DIR/<model> to each checked model")
    args = ap.parse_args(argv)
    root = Path(args.root)
    doc = load_manifest(root / "manifest.json")
    bad = problems(root, doc)
    if bad:
        print(f"shipped models under {root} do not match {root / 'manifest.json'}:", *bad, sep="\n  ",
              file=sys.stderr)
        print("(a git checkout restores them; `make train` rebuilds them and the manifest)", file=sys.stderr)
        return 1
    size = sum(f["size"] for m in doc["models"].values() for f in m["files"].values())
    print(f"models: {', '.join(doc['models'])} verified ({size / 1e6:.1f} MB)")
    if args.link:
        for lnk in link(Path(args.link), root, doc):
            print(f"  {lnk} -> {os.readlink(lnk)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
