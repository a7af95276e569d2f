"""A clone is self-contained: the default registry and the training queries are in the checkout, and nothing the
product or its tests run reaches outside it."""

import subprocess
import sys

from tests.conftest import REPO

OUTSIDE = ("../" + "shared", "/work/" + "shared", "shared/" + "data/")


def tracked() -> list[str]:
    out = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True)
    return out.stdout.split()


def test_no_code_makefile_or_test_reaches_beside_the_checkout():
    bad = []
    for path in tracked():
        if path.startswith(("docs/experiments/", "reports/")) or not path.endswith(
                (".py", ".toml", ".yml", ".yaml", ".sh", "Makefile", ".cfg")):
            continue
        text = (REPO / path).read_text(errors="replace")
        if any(w in text for w in OUTSIDE):
            bad.append(path)
    assert bad == [], bad


def test_a_copy_of_the_tracked_files_finds_its_default_registry_and_queries(tmp_path):
    """The tracked tree copied alone (nothing beside it): the CLI's default registry is the copy's own 338
    tools, and the training queries load."""
    import shutil

    root = tmp_path / "alone" / "nexus"
    for path in tracked():
        if path.startswith(("services/", "training/", "evals/", "cli/", "data/", "nexus_client/")) or path in ("pyproject.toml",):
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / path, root / path)
    shutil.copytree(REPO / "nexus", root / "nexus")  # the generated stubs (make proto)
    code = ("from cli.main import _default_tools_dir; from services.common.tools import load_registry_dir; "
            "from training.data import load_queries; d = _default_tools_dir(); "
            "print(d, len(list(load_registry_dir(d))), len(load_queries('data/queries/train.jsonl')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    where, tools, lines = out.stdout.split()
    assert where.startswith(str(root)) and int(tools) == 338 and int(lines) == 962
