"""The tree stays clean under ruff (pyproject.toml's rules), as `make lint` checks it: a finding fails `make test`,
so it is fixed in the commit that makes it."""

import subprocess

from tests.conftest import REPO

PATHS = ["services", "tests", "nexus_client", "examples", "deploy", "native/src", "bench", "data"]


def test_ruff_finds_nothing():
    ruff = REPO / ".venv" / "bin" / "ruff"
    assert ruff.is_file(), "no ruff in .venv: run `make setup` (requirements.txt pins it)"
    out = subprocess.run([str(ruff), "check", "--no-cache", *PATHS], cwd=REPO, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]


def test_make_lint_checks_the_same_paths():
    makefile = (REPO / "Makefile").read_text()
    assert "ruff check " + " ".join(PATHS) in makefile
