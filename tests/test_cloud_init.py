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


def test_the_host_key_is_installed_from_the_secret_store(tmp_path: Path):
    """The script cloud-init runs when the user data holds no private key, run for real with a
    stand-in for the cloud's CLI (a secret that appears on the second try) and for sshd."""
    from infra.cloud_init import host_key_script

    secret, tries = tmp_path / "secret", tmp_path / "tries"
    fetch = (f"echo x >> {tries}; [ $(wc -l < {tries}) -ge 2 ] && cat {secret}")
    secret.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nabc\n-----END OPENSSH PRIVATE "
                      "KEY-----\n")
    script = tmp_path / "install.sh"
    script.write_text(host_key_script(fetch, "ssh-ed25519 AAAAC3Nz node-0", str(tmp_path),
                                      f"touch {tmp_path}/restarted").replace("sleep 10",
                                                                           "sleep 0"))
    subprocess.run(["sh", str(script)], check=True, timeout=60)
    key = tmp_path / "ssh_host_ed25519_key"
    assert key.read_text() == secret.read_text()
    assert key.stat().st_mode & 0o077 == 0, "the private key is the owner's alone"
    assert (tmp_path / "ssh_host_ed25519_key.pub").read_text() == "ssh-ed25519 AAAAC3Nz node-0\n"
    assert (tmp_path / "restarted").exists() and tries.read_text() == "x\nx\n"
