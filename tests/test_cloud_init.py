"""The node's Python, probed at boot by the command every cloud's cloud-init ends with: run here
for real with `sh`, against a Python that has torch and one that has not."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from infra.cloud_init import python_probe

pytestmark = pytest.mark.unit


def probe(tmp_path: Path, *candidates: str) -> Path:
    tmp_path.mkdir(exist_ok=True)
    link = tmp_path / "sortie-python"
    subprocess.run(python_probe(candidates, str(link)), check=True, timeout=120)
    return link


def test_the_first_python_with_torch_is_linked(tmp_path: Path):
    bare = tmp_path / "bare"  # a Python without torch comes first
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    link = probe(tmp_path, str(tmp_path / "missing" / "python3"), str(bare / "bin" / "python"),
                 sys.executable)
    # Run as the outputs' python: this test's venv (a venv, like the images') with torch.
    ran = subprocess.run([str(link), "-c", "import sys, torch; print(sys.prefix)"],
                         capture_output=True, text=True, check=True)
    assert ran.stdout.strip() == sys.prefix


def test_without_torch_anywhere_the_first_python_that_exists_is_linked(tmp_path: Path):
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    link = probe(tmp_path, str(tmp_path / "missing" / "python3"), str(bare / "bin" / "python"))
    assert str(bare / "bin" / "python") in link.read_text(), "the node check then names it"
    nothing = probe(tmp_path / "none", str(tmp_path / "missing"))  # no Python at all: no error
    assert not nothing.exists(), "and no link: the node check says the Python is missing"
