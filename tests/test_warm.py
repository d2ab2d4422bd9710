"""The warm `sortie` (`sortie/cli/warm.py`) through the real executable: a command run by the warm
process says and exits exactly as one run in the `sortie` process, which then loads none of
sortie's modules; Ctrl-C reaches the command; a killed `sortie` process takes its command with
it; a directory others could enter is never used. Each test has a warm process of its own
(its own XDG_RUNTIME_DIR)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from tests.helpers import (
    REPO,
    child_env,
    controller_output,
    exit_code,
    follow_until,
    needs_sshd,
    warm_processes,
)

# The `sortie` executable, telling on stderr whether it loaded the CLI's modules itself.
CLIENT = ("import sys\nfrom sortie.cli import start\ntry:\n    start.entry()\nfinally:\n"
          "    print('ran here' if 'sortie.cli.app' in sys.modules else 'ran warm', "
          "file=sys.stderr)\n")


@pytest.fixture
def runtime() -> Path:
    # Short: a Unix socket's path has at most 107 bytes (a longer one: nothing is warm).
    directory = Path(tempfile.mkdtemp(prefix="sw-"))
    yield directory
    for proc in warm_processes(directory):  # this test's warm process: gone
        proc.kill()
    shutil.rmtree(directory, ignore_errors=True)


def env_for(runtime: Path, sortie_home: Path, **extra: str) -> dict[str, str]:
    return child_env({"XDG_RUNTIME_DIR": str(runtime), "SORTIE_HOME": str(sortie_home),
                      "PYTHONPATH": str(REPO), **extra})


def client(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", CLIENT, *args], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def warm_server(runtime: Path, timeout: float = 60) -> psutil.Process:
    """The warm process, once its socket is up (it loads sortie's modules first)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        running = warm_processes(runtime)
        if running and any((runtime / "sortie").glob("*.sock")):
            return running[0]
        time.sleep(0.1)
    pytest.fail("no warm process came up")


@pytest.mark.e2e
def test_a_warm_command_says_and_exits_as_one_run_here(runtime: Path, sortie_home: Path,
                                                        tmp_path: Path):
    env = env_for(runtime, sortie_home)
    cold = client("profiles", "--json", env={**env, "SORTIE_WARM": "0"}, cwd=tmp_path)
    assert cold.returncode == 0 and "ran here" in cold.stderr
    assert not (runtime / "sortie").exists(), "SORTIE_WARM=0: nothing warm"

    first = client("profiles", "--json", env=env, cwd=tmp_path)  # starts one for the next
    assert first.returncode == 0 and "ran here" in first.stderr
    server = warm_server(runtime)
    assert oct((runtime / "sortie").stat().st_mode & 0o777) == "0o700"
    (sock,) = (runtime / "sortie").glob("*.sock")
    assert oct(sock.stat().st_mode & 0o777) == "0o600"
    assert str(sortie_home) not in " ".join(server.environ().values()), \
        "the warm process names no command's sortie home"

    warm = client("profiles", "--json", env=env, cwd=tmp_path)
    assert warm.returncode == 0 and "ran warm" in warm.stderr, warm.stderr
    assert json.loads(warm.stdout) == json.loads(cold.stdout)
    # Bad input: the same one line and exit code 2; the working directory is the caller's.
    (tmp_path / "task.yaml").write_text("nodes: -1\n")
    bad = [client("run", "task.yaml", env=e, cwd=tmp_path)
           for e in ({**env, "SORTIE_WARM": "0"}, env)]
    assert [b.returncode for b in bad] == [2, 2]
    assert "ran warm" in bad[1].stderr
    said = [b.stderr.replace("ran here", "").replace("ran warm", "") for b in bad]
    assert said[0] == said[1] and "nodes" in said[0] and "Traceback" not in said[0]


@pytest.mark.e2e
@needs_sshd
def test_ctrl_c_reaches_a_warm_command_and_a_killed_client_takes_its_command(
        runtime: Path, sortie_home: Path, tmp_path: Path):
    env = env_for(runtime, sortie_home, PYTHONUNBUFFERED="1")
    assert client("profiles", env=env, cwd=tmp_path).returncode == 0
    server = warm_server(runtime)
    up = client("up", "--nodes", "1", "--name", "w", env=env, cwd=tmp_path)
    assert up.returncode == 0 and "ran warm" in up.stderr, up.stderr
    job = tmp_path / "job"
    job.mkdir()
    (job / "task.yaml").write_text("workdir: .\nrun: echo waiting; sleep 120\n")
    try:
        for signum, code in ((signal.SIGINT, 130), (signal.SIGKILL, -signal.SIGKILL)):
            proc = subprocess.Popen([sys.executable, "-c", CLIENT, "exec", "w",
                                     str(job / "task.yaml"), "--runs-dir", str(tmp_path / "r")],
                                    env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True)
            seen: list[str] = []
            reader = follow_until(proc, seen, lambda line: "waiting" in line)
            [command] = server.children()  # the command runs in a copy of the warm process
            proc.send_signal(signum)
            assert exit_code(proc, seen, 120) == code, "".join(seen)
            reader.join(10)
            if signum == signal.SIGINT:  # it stopped the job, collected, and said so
                said = controller_output(seen)
                assert "sortie: error: interrupted" in said and "ran warm" in said, said
            assert psutil.wait_procs([command], timeout=30)[1] == [], "the command is gone"
    finally:
        down = client("down", "w", env=env, cwd=tmp_path)
        assert down.returncode == 0, down.stderr


@pytest.mark.unit
def test_a_directory_others_can_enter_is_never_used(runtime: Path,
                                                     monkeypatch: pytest.MonkeyPatch):
    from sortie.cli import warm

    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    (runtime / "sortie").mkdir(mode=0o755)
    os.chmod(runtime / "sortie", 0o755)  # whatever the umask made of it
    assert warm.socket_path() is None
    assert warm.run_warm(["profiles"]) is None, "run here, and no warm process started"
    assert list((runtime / "sortie").iterdir()) == []
    os.chmod(runtime / "sortie", 0o700)
    path = warm.socket_path()
    assert path is not None and path.parent == runtime / "sortie"
    # A path a Unix socket cannot have: nothing is warm (before: the warm process died on it).
    deep = runtime / ("d" * 90)
    deep.mkdir()
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(deep))
    assert warm.socket_path() is None and warm.run_warm(["profiles"]) is None
