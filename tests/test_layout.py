"""Imports run one way (docs/layout.md): the command line -> the run engine -> the fleet and
the run directory -> the backends (`stacks/`) -> money (`sortie/cost/`) and bootstrap -> the
Pulumi programs (`infra/`) and the trainer (`trainer/`) -> the shared kernel (`sortie/core/`),
at the bottom; no two modules of a package import each other; everything is imported through
the one name `sortie` (the top-level folders are linked in as sortie.infra, sortie.stacks, ...).
import-linter checks all three, from the contracts in pyproject.toml."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from tests.helpers import REPO

# Each test's mark is its own: `unit` starts no process, `e2e` does (issue 63).

PACKAGES = ("sortie", "stacks", "bootstrap", "infra", "trainer")  # the folders on disk
LINKED = PACKAGES[1:]  # each sortie/<name> -> ../<name>
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(LINT_IMPORTS), "--no-cache", "--no-logo"], cwd=root,
                          env={**os.environ, "PYTHONPATH": str(root)},
                          capture_output=True, text=True, timeout=120)


@pytest.mark.e2e
def test_imports_run_one_way_without_cycles() -> None:
    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    assert {c["type"] for c in contracts["contracts"]} == {"layers", "acyclic_siblings",
                                                           "forbidden"}
    assert not any("ignore_imports" in c for c in contracts["contracts"]), "no exceptions"
    assert contracts["exclude_type_checking_imports"] is False, "type hints count: no circles"
    checked = lint_imports(REPO)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "3 kept, 0 broken" in checked.stdout


@pytest.mark.e2e
def test_the_contract_sees_a_wrong_import(tmp_path: Path) -> None:
    """The checks themselves: a lazy import inside a function, up a layer, breaks the
    layers; an import back between two modules of a package breaks the second; a folder's bare
    name (which only a checkout has) breaks the third."""
    shutil.copy(REPO / "pyproject.toml", tmp_path)
    for package in PACKAGES:
        shutil.copytree(REPO / package, tmp_path / package, symlinks=True,
                        ignore=shutil.ignore_patterns("__pycache__", "*.yaml", "*.j2"))
    with (tmp_path / "bootstrap" / "ssh.py").open("a") as module:
        module.write("\n\ndef upward():\n    from sortie.stacks.local.local_backend import "
                     "LocalBackend\n\n    return LocalBackend\n")
    with (tmp_path / "stacks" / "machine" / "loopback.py").open("a") as module:
        module.write("\n\nfrom infra.spec import ClusterSpec  # noqa: E402, F401\n")
    # and a cycle within a package: the run directory's metrics importing its report
    with (tmp_path / "sortie" / "rundir" / "metrics.py").open("a") as module:
        module.write("\n\nfrom sortie.rundir.report import REPORT_FILE  # noqa: E402, F401\n")
    checked = lint_imports(tmp_path)
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert "sortie.bootstrap.ssh -> sortie.stacks.local.local_backend" in checked.stdout, \
        checked.stdout
    assert "sortie.stacks.machine.loopback -> infra" in checked.stdout, checked.stdout
    assert "0 kept, 3 broken" in checked.stdout, checked.stdout


@pytest.mark.unit
def test_every_package_is_installed() -> None:
    """The wheel's packages are found through the links (pyproject names none): every folder
    of ours with code, under the one name `sortie`, and nothing else."""
    from setuptools import find_packages

    found = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert found["packages"]["find"]["include"] == ["sortie", "sortie.*"]
    on_disk = {"sortie." * (package != "sortie") + str(init.parent.relative_to(REPO))
               .replace("/", ".") for package in PACKAGES
               for init in (REPO / package).rglob("__init__.py")}
    assert set(find_packages(str(REPO), include=["sortie", "sortie.*"])) == on_disk
    assert "sortie.infra.azure" in on_disk and "sortie.cost" in on_disk


@pytest.mark.unit
def test_the_folders_are_linked_into_the_package() -> None:
    """A checkout imports what the wheel installs: sortie/infra is the folder infra/, by a
    relative link (a clone anywhere keeps it)."""
    for name in LINKED:
        link = REPO / "sortie" / name
        assert link.is_symlink() and os.readlink(link) == f"../{name}", name
        assert link.resolve() == (REPO / name).resolve()


@pytest.mark.unit
def test_no_two_modules_share_a_name() -> None:
    """Across the command line, the engine, the backends and bootstrap a module's name says
    which one it is: `attach.py` three times told a reader nothing."""
    modules: dict[str, list[str]] = {}
    for package in ("sortie", "stacks", "bootstrap"):
        for path in (REPO / package).rglob("*.py"):
            if path.name not in ("__init__.py", "__main__.py"):
                modules.setdefault(path.name, []).append(str(path.relative_to(REPO)))
    shared = {name: paths for name, paths in modules.items() if len(paths) > 1}
    assert not shared, shared


@pytest.mark.unit
def test_no_module_is_over_400_lines() -> None:
    """Small modules, each read in one pass (the style guide)."""
    long = {str(path.relative_to(REPO)): lines for package in PACKAGES
            for path in (REPO / package).rglob("*.py")
            if (lines := len(path.read_text().splitlines())) > 400}
    assert not long, long


@pytest.mark.unit
def test_the_engine_asks_a_backend_what_it_can_do_not_what_it_is() -> None:
    """No `isinstance` on a backend's (or a listing's) class outside its own module: the
    engine, the fleet and the CLI ask its capabilities (`stacks/backend.py`), so a new backend
    is its module and one line in the registry."""
    classes: dict[str, Path] = {}  # every class a backend module defines -> that module
    for path in (REPO / "stacks").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and ("Backend" in node.name or any(
                    isinstance(base, ast.Name) and base.id == "Listing" for base in node.bases)
                    or node.name in ("CloudRecords", "KeptBuckets")):
                classes[node.name] = path
    assert {"LocalBackend", "PulumiBackend", "AttachedBackend", "CloudRecords"} <= set(classes)
    asked = []
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "isinstance" \
                        and len(node.args) == 2:
                    named = {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)}
                    asked += [f"{path.relative_to(REPO)}: {name}" for name in named
                              if name in classes and classes[name] != path]
    assert not asked, asked


@pytest.mark.unit
def test_tests_and_benchmarks_import_through_sortie_too() -> None:
    """In a checkout `import infra.spec` works as well, and loads a second copy of every module
    (two ClusterSpec classes, two registries): the tests and benchmarks use `sortie.` names
    (the trainer's `python -m trainer`, as a node runs it, is a command, not an import)."""
    bare = re.compile(r"^\s*(from|import) (infra|stacks|bootstrap|trainer)\b|"
                      r"import_module\(f?[\"'](infra|stacks|bootstrap|trainer)\.", re.M)
    found = [f"{path.relative_to(REPO)}: {match.group(0).strip()}"
             for folder in ("tests", "benchmarks") for path in (REPO / folder).rglob("*.py")
             for match in bare.finditer(path.read_text())]
    assert not found, found
