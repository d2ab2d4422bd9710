"""The suite's own rules (issue 63): a test never fails from load alone. pytest-timeout's
default (pyproject's `timeout`) is a hang guard; a test that allows one of its own steps that
long or longer carries a `timeout` mark of its own, or a slow machine ends it mid-step (the
booted image test's `exec`, allowed 900 s, was cut at 300 on a machine 2.5 times slower)."""

from __future__ import annotations

import ast

import pytest
import tomllib

from tests.helpers import REPO

DEFAULT_S = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"][
    "ini_options"]["timeout"]


def _marked(decorators: list[ast.expr]) -> bool:
    return any("mark.timeout" in ast.unparse(d) for d in decorators)


def _longest_step(test: ast.FunctionDef) -> float:
    """The longest ``timeout=`` a call in ``test`` gives a step of its own (a constant)."""
    return max((k.value.value for call in ast.walk(test) if isinstance(call, ast.Call)
                for k in call.keywords if k.arg == "timeout" and isinstance(k.value, ast.Constant)
                and isinstance(k.value.value, int | float)), default=0)


@pytest.mark.unit
def test_a_test_that_allows_a_step_the_default_limit_says_its_own() -> None:
    found = []
    for path in sorted((REPO / "tests").glob("test_*.py")):
        module = ast.parse(path.read_text())
        module_marked = any(isinstance(node, ast.Assign) and "pytestmark" in ast.unparse(
            node.targets[0]) and "mark.timeout" in ast.unparse(node.value) for node in module.body)
        found += [f"{path.name}::{node.name} (a step of {_longest_step(node):g} s)"
                  for node in module.body if isinstance(node, ast.FunctionDef)
                  and node.name.startswith("test_") and not module_marked
                  and not _marked(node.decorator_list) and _longest_step(node) >= DEFAULT_S]
    assert not found, found
