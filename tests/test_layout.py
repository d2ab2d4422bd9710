"""Imports run one way (README, "Layout"): the command line and lifecycle (`sortie/`) -> the
backends (`stacks/`) -> bootstrap (`bootstrap/`, whose inventory and errors every layer shares);
the Pulumi programs (`infra/`) and the trainer (`trainer/`) need nothing of ours."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.unit

OURS = {"sortie", "stacks", "bootstrap", "infra", "trainer", "tests", "benchmarks"}
# What each package may import of ours besides itself (modules, or whole packages).
ALLOWED = {
    "trainer": set(),
    "infra": set(),
    "bootstrap": {"trainer"},  # it ships the trainer to the nodes
    "stacks": {"infra", "bootstrap.errors", "bootstrap.inventory", "bootstrap.statefile",
               "bootstrap.userfile"},
    "sortie": {"stacks", "bootstrap", "infra", "trainer"},
}


def imports_of(path: Path) -> set[str]:
    """Every module of ours that a file imports, at the top or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # `from bootstrap import ssh` imports bootstrap.ssh
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return {name for name in found if name.split(".")[0] in OURS}


def allowed(package: str, module: str) -> bool:
    if module.split(".")[0] == package:
        return True
    return any(module == rule or module.startswith(rule + ".") for rule in ALLOWED[package])


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_imports_run_one_way(package: str) -> None:
    wrong = [f"{path.relative_to(REPO)} imports {module}"
             for path in sorted((REPO / package).rglob("*.py"))
             for module in sorted(imports_of(path)) if not allowed(package, module)]
    assert not wrong, "\n".join(wrong)


def test_the_rule_sees_a_wrong_import(tmp_path: Path) -> None:
    """The check itself: a lazy import inside a function counts, and is refused."""
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from stacks.local import LocalBackend\n"
                      "    from bootstrap import ssh\n")
    assert imports_of(module) == {"stacks.local.LocalBackend", "bootstrap.ssh"}
    assert not allowed("bootstrap", "stacks.local.LocalBackend")
    assert not allowed("stacks", "bootstrap.ssh")
    assert allowed("stacks", "bootstrap.inventory.Node")


def test_every_package_is_installed() -> None:
    """pyproject's package list is every folder of ours with code (a new subpackage that is
    left out would be missing from a non-editable install)."""
    import tomllib

    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
                 ["packages"])
    on_disk = {str(init.parent.relative_to(REPO)).replace("/", ".")
               for package in ALLOWED for init in (REPO / package).rglob("__init__.py")}
    assert listed == on_disk
