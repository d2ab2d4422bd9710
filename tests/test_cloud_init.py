"""The node's Python, probed at boot by the command every cloud's cloud-init ends with: run here
for real with `sh`, against a Python that has torch and one that has not."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from sortie.infra.cloud_init import WORK_CGROUPS, idle_stop_script, python_probe

pytestmark = pytest.mark.e2e  # each runs the nodes' own scripts in a shell


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
    from sortie.infra.cloud_init import host_key_script

    secret, tries = tmp_path / "secret", tmp_path / "tries"
    fetch = (f"echo x >> {tries}; [ $(wc -l < {tries}) -ge 2 ] && cat {secret}")
    secret.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nabc\n-----END OPENSSH PRIVATE "
                      "KEY-----\n")
    script = tmp_path / "install.sh"
    script.write_text(host_key_script(fetch, "ssh-ed25519 AAAAC3Nz node-0", str(tmp_path),
                                      f"touch {tmp_path}/restarted", first_wait_s=0))
    subprocess.run(["sh", str(script)], check=True, timeout=60)
    key = tmp_path / "ssh_host_ed25519_key"
    assert key.read_text() == secret.read_text()
    assert key.stat().st_mode & 0o077 == 0, "the private key is the owner's alone"
    assert (tmp_path / "ssh_host_ed25519_key.pub").read_text() == "ssh-ed25519 AAAAC3Nz node-0\n"
    assert (tmp_path / "restarted").exists() and tries.read_text() == "x\nx\n"


def test_a_host_key_that_never_comes_is_said_on_the_console(tmp_path: Path):
    """Tries back off for half an hour (an Azure role can take 10 minutes to apply; before: 60
    tries 10 s apart), then one line on the console, where a user reading the cloud's serial
    output looks, beside the fetch's own errors."""
    from sortie.infra.cloud_init import HOST_KEY_GIVE_UP_S, host_key_script

    assert HOST_KEY_GIVE_UP_S == 30 * 60
    console = tmp_path / "console"
    script = tmp_path / "install.sh"
    script.write_text(host_key_script("echo 'AccessDenied: not yet' >&2; false", "ssh-ed25519 A",
                                      str(tmp_path), "touch restarted", give_up_s=0,
                                      first_wait_s=0, console=str(console)))
    done = subprocess.run(["sh", str(script)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "AccessDenied: not yet" in done.stderr
    said = "sortie: could not fetch this node's SSH host key for 1 minute ("
    assert said in done.stderr and said in console.read_text()
    assert not (tmp_path / "ssh_host_ed25519_key").exists()


KEY = "-----BEGIN OPENSSH PRIVATE KEY-----\nxyz\n-----END OPENSSH PRIVATE KEY-----"
Answer = Callable[[str, dict, dict], tuple[int, dict]]


def fetch_from_stand_in(tmp_path: Path, answer: Answer, fetcher: tuple[str, str],
                        arguments: Callable[[str], str]) -> list[tuple[str, dict, dict]]:
    """Run a node's host-key fetcher for real, as cloud-init does (through the install
    script), against a loopback stand-in for its cloud that ``answer``s each GET (path, query,
    headers); ``arguments`` makes the fetcher's arguments from the stand-in's base URL. Returns
    the requests seen, once the key is installed."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from urllib.parse import parse_qs, urlsplit

    from sortie.infra.cloud_init import host_key_script

    seen: list[tuple[str, dict, dict]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the http.server interface
            url = urlsplit(self.path)
            seen.append((url.path, parse_qs(url.query), dict(self.headers)))
            status, body = answer(url.path, parse_qs(url.query), dict(self.headers))
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    script_path = tmp_path / Path(fetcher[0]).name
    script_path.write_text(fetcher[1])
    fetch = f"{sys.executable} {script_path} {arguments(base)}"
    script = tmp_path / "install.sh"
    script.write_text(host_key_script(fetch, "ssh-ed25519 AAAAC3Nz node-0", str(tmp_path),
                                      f"touch {tmp_path}/restarted", first_wait_s=0))
    try:
        subprocess.run(["sh", str(script)], check=True, timeout=60, capture_output=True)
    finally:
        server.shutdown()
    assert (tmp_path / "ssh_host_ed25519_key").read_text() == KEY + "\n"
    assert (tmp_path / "restarted").exists()
    return seen


def test_an_azure_node_reads_its_host_key_from_key_vault_as_its_identity(tmp_path: Path):
    """The script Azure nodes fetch their key with, against a stand-in for the metadata
    service and Key Vault. The vault first refuses (the node's role not yet in effect)."""
    from sortie.infra.azure.program import HOST_KEY_FETCHER

    vault_reads: list[str] = []

    def answer(path: str, query: dict, headers: dict) -> tuple[int, dict]:
        if path == "/metadata/identity/oauth2/token" and headers.get("Metadata") == "true":
            return 200, {"access_token": "node-0-token", "token_type": "Bearer"}
        if path == "/secrets/host-key-node-0" and \
                headers.get("Authorization") == "Bearer node-0-token":
            vault_reads.append(path)
            return (403, {"error": {"code": "Forbidden"}}) if len(vault_reads) == 1 else \
                (200, {"value": KEY, "id": "https://vault/secrets/host-key-node-0/1"})
        return 401, {"error": {"code": "Unauthorized"}}

    seen = fetch_from_stand_in(tmp_path, answer, HOST_KEY_FETCHER, lambda base: (
        f"{base}/ host-key-node-0 client-0 {base}/metadata/identity/oauth2/token"))
    token_requests = [q for path, q, _ in seen if path.endswith("/token")]
    assert token_requests[0] == {"api-version": ["2018-02-01"],
                                 "resource": ["https://vault.azure.net"],
                                 "client_id": ["client-0"]}
    vault_requests = [q for path, q, _ in seen if path.startswith("/secrets/")]
    assert len(vault_requests) == 2 and vault_requests[0]["api-version"] == ["7.4"]


def test_a_gcp_node_reads_its_host_key_from_secret_manager_as_its_account(tmp_path: Path):
    """GCP's fetcher (the standard library: no gcloud on root's PATH), against a stand-in for
    the metadata server and Secret Manager, which first refuses (the grant not yet in effect)."""
    import base64

    from sortie.infra.gcp.program import HOST_KEY_FETCHER

    secret = "/v1/projects/proj-1/secrets/sortie-edge-host-key-node-0/versions/latest:access"
    reads: list[str] = []

    def answer(path: str, query: dict, headers: dict) -> tuple[int, dict]:
        if path == "/token" and headers.get("Metadata-Flavor") == "Google":
            return 200, {"access_token": "sa-token", "token_type": "Bearer"}
        if path == secret and headers.get("Authorization") == "Bearer sa-token":
            reads.append(path)
            return (403, {"error": {"code": 403}}) if len(reads) == 1 else \
                (200, {"payload": {"data": base64.b64encode(KEY.encode()).decode()}})
        return 401, {"error": {"code": 401}}

    fetch_from_stand_in(tmp_path, answer, HOST_KEY_FETCHER, lambda base: (
        f"proj-1 sortie-edge-host-key-node-0 {base}/token {base}/v1"))
    assert len(reads) == 2, "refused once, then read"





# The cgroups the idle stop counts as work, narrowed to this test process's own (under
# /sortie-test-<pid>/): the machine running the tests has sessions and containers of its own, and
# a second checkout's tests beside them made "idle" nodes busy (CI beside a `make test`).
OWN_GROUPS = f"/sortie-test-{os.getpid()}/.*({WORK_CGROUPS})"


def idle_check(tmp_path: Path, idle_s: int, uid: int, env: dict | None = None
               ) -> tuple[Path, Path]:
    """The node's idle stop, run here for real with `sh` (as its timer runs it each minute),
    counting only processes of ``uid`` as a login user's and only this test's cgroups as
    sessions and containers; powering off only leaves a file."""
    stamp, off = tmp_path / "last-busy", tmp_path / "powered-off"
    script = idle_stop_script(idle_s, stamp=str(stamp), poweroff=f"touch {off}", min_uid=uid,
                              max_uid=uid, console=str(tmp_path / "console"),
                              work_cgroups=OWN_GROUPS)
    subprocess.run(["sh", "-c", script], check=True, timeout=30, env=env)
    return stamp, off


def cgroup2_root() -> Path | None:
    """Where cgroup v2 is mounted, if this process may make groups there (root)."""
    if os.geteuid() != 0:
        return None
    for line in Path("/proc/mounts").read_text().splitlines():
        fields = line.split()
        if fields[2] == "cgroup2" and os.access(fields[1], os.W_OK):
            return Path(fields[1])
    return None


def test_an_idle_node_powers_itself_off_after_the_limit(tmp_path: Path):
    unused = 4_000_000  # no process runs as this user: the node is idle
    stamp, off = idle_check(tmp_path, 2, unused)
    assert stamp.exists() and not off.exists(), "the first check only starts the count"
    os.utime(stamp, (time.time() - 3, time.time() - 3))  # 3 s of nothing
    idle_check(tmp_path, 2, unused)
    assert off.exists()
    assert "idle for" in (tmp_path / "console").read_text()


def test_a_node_with_a_users_process_is_busy(tmp_path: Path):
    stamp, off = idle_check(tmp_path, 2, os.getuid())  # this test runs as that user
    os.utime(stamp, (time.time() - 60, time.time() - 60))
    idle_check(tmp_path, 2, os.getuid())
    assert not off.exists() and time.time() - stamp.stat().st_mtime < 30, \
        "busy: the count starts again"


@pytest.mark.skipif(cgroup2_root() is None, reason="making cgroups needs root and cgroup v2")
def test_a_root_job_in_a_login_session_or_a_container_is_work(tmp_path: Path):
    """Third review: only uid 1000-65533 counted, so a job running as root (sudo, containers)
    was "idle" and the node powered off under it. A process's cgroup says where it runs."""
    unused = 4_000_000  # no login user's process: only the cgroup can make the node busy
    base = cgroup2_root() / f"sortie-test-{os.getpid()}"
    session = base / "user.slice" / "user-0.slice" / "session-7.scope"
    container = base / "system.slice" / "docker-0123abcd.scope"
    daemon = base / "system.slice" / "cron.service"
    for group in (session, container, daemon):
        group.mkdir(parents=True)
    job = subprocess.Popen(["sleep", "300"])  # a root job
    try:
        for group, work in ((session, True), (container, True), (daemon, False)):
            (group / "cgroup.procs").write_text(f"{job.pid}\n")
            stamp, off = idle_check(tmp_path, 2, unused)
            os.utime(stamp, (time.time() - 60, time.time() - 60))
            idle_check(tmp_path, 2, unused)
            assert off.exists() != work, (group, "work" if work else "a daemon")
            off.unlink(missing_ok=True)
    finally:
        job.kill()
        job.wait()
        for group in (session, container, daemon, session.parent, session.parent.parent,
                      daemon.parent, base):
            group.rmdir()


def test_a_gpu_in_use_is_work(tmp_path: Path):
    """A GPU's compute process (or its use, where a container hides the process) is work; a
    stand-in `nvidia-smi` says so, as no GPU is here."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\ncase \"$*\" in *compute-apps*) echo \"$APPS\";; "
                   "*utilization*) echo \"$UTIL\";; esac\n")
    smi.chmod(0o755)
    unused = 4_000_000
    for apps, util, work in (("4242", "0", True), ("", "37", True), ("", "0", False)):
        env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "APPS": apps,
               "UTIL": util}
        stamp, off = idle_check(tmp_path, 2, unused, env)
        os.utime(stamp, (time.time() - 60, time.time() - 60))
        idle_check(tmp_path, 2, unused, env)
        assert off.exists() != work, (apps, util)
        off.unlink(missing_ok=True)


def test_a_pattern_candidate_finds_the_images_environment_wherever_it_is(tmp_path: Path):
    """Issue 64: GCP's Deep Learning VM families move their PyTorch environment (/opt/conda,
    then a venv under /opt named by the family); a pattern finds it under any name."""
    opt = tmp_path / "opt"
    (opt / "empty" / "bin").mkdir(parents=True)  # a match without a Python comes first
    (opt / "pytorch-2-9" / "bin").mkdir(parents=True)
    (opt / "pytorch-2-9" / "bin" / "python3").symlink_to(sys.executable)
    link = probe(tmp_path, str(tmp_path / "missing" / "python3"), f"{opt}/*/bin/python3")
    assert f"{opt}/pytorch-2-9/bin/python3" in link.read_text()
