"""Shared fixtures. SSH tests run against real OpenSSH daemons that the tests start themselves."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from stacks.errors import SortieError
from stacks.local import LocalBackend, find_sshd

REPO = Path(__file__).resolve().parent.parent


def _sshd_missing() -> str | None:
    try:
        find_sshd()
    except SortieError as exc:
        return str(exc)
    return None


needs_sshd = pytest.mark.skipif(_sshd_missing() is not None,
                                reason=f"real sshd needed: {_sshd_missing()}")


@pytest.fixture
def sortie_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private SORTIE_HOME so that tests never see each other's or the user's clusters."""
    home = tmp_path / "sortie-home"
    monkeypatch.setenv("SORTIE_HOME", str(home))
    return home


@pytest.fixture
def backend(sortie_home: Path) -> LocalBackend:
    local = LocalBackend(sortie_home)
    yield local
    for cluster_id in local.cluster_ids():  # never leak daemons, even when a test fails
        local.down(cluster_id)


def sortie(*args: str, cwd: Path, timeout: float = 300, **kwargs) -> subprocess.CompletedProcess:
    """Run the real CLI in a child process, as a user would."""
    return subprocess.run([sys.executable, "-m", "stacks", *args], cwd=cwd, env=os.environ.copy(),
                          capture_output=True, text=True, timeout=timeout, **kwargs)


def processes_mentioning(path: Path) -> list[str]:
    """Live processes whose command line or working directory is under ``path``."""
    marker, found = f"{path}/", []
    for proc in psutil.process_iter(["cmdline", "cwd", "status"]):
        if proc.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        cmdline = " ".join(proc.info["cmdline"] or [])
        if marker in cmdline or f"{proc.info['cwd'] or ''}/".startswith(marker):
            found.append(f"{proc.pid} {cmdline}")
    return found


def loopback_listeners() -> set[tuple[str, int]]:
    """TCP sockets listening on loopback, where local nodes and their rendezvous live."""
    return {(c.laddr.ip, c.laddr.port) for c in psutil.net_connections(kind="tcp")
            if c.status == psutil.CONN_LISTEN and c.laddr.ip.startswith("127.")}
