"""The layers hold (pyproject.toml's [tool.importlinter] contracts, as `make lint` checks them): serving code
(services/: router, compiler, engine, openai, runtime, common) imports no training, evaluation or command-line code
(top-level training/, evals/, cli/), and no package imports a
sibling that imports it back. A broken contract fails `make test`, so it is fixed in the commit that breaks it."""

import subprocess

from tests.conftest import REPO


def lint_imports(*args: str) -> subprocess.CompletedProcess:
    exe = REPO / ".venv" / "bin" / "lint-imports"
    assert exe.is_file(), "no lint-imports in .venv: run `make setup` (requirements.txt pins import-linter)"
    return subprocess.run([str(exe), "--no-cache", *args], cwd=REPO, capture_output=True, text=True, timeout=300)


def test_the_import_contracts_are_kept():
    out = lint_imports()
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "0 broken" in out.stdout


def test_a_serving_module_that_imports_training_code_breaks_the_contract(tmp_path):
    # the same contracts over a copy of the tree with one forbidden import added: the checker must catch it
    import shutil

    root = tmp_path / "repo"
    for pkg in ("services", "training", "evals", "cli"):
        shutil.copytree(REPO / pkg, root / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")
    bad = root / "services" / "router" / "leak.py"
    bad.write_text("from training import gate  # noqa: F401\n")
    exe = REPO / ".venv" / "bin" / "lint-imports"
    out = subprocess.run([str(exe), "--no-cache"], cwd=root, capture_output=True, text=True, timeout=300,
                         env={"PYTHONPATH": str(root), "PATH": str(REPO / ".venv" / "bin")})
    assert out.returncode != 0, out.stdout[-3000:]
    assert "services.router.leak -> training.gate" in out.stdout


def test_make_lint_runs_ruff_and_the_import_contracts():
    makefile = (REPO / "Makefile").read_text()
    lint = makefile[makefile.index("\nlint:"):].split("\n\n")[0]
    assert "ruff check" in lint and "lint-imports" in lint
    assert "make lint" in (REPO / ".ci" / "run").read_text()
