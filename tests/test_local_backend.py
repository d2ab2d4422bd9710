"""The local backend against real sshd: nodes on loopback, keys per cluster, proven teardown."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import paramiko
import psutil
import pytest

from sortie.bootstrap import cluster_lock, node_layout, ssh
from sortie.bootstrap.node_layout import run_dir
from sortie.stacks.backend import NameTakenError
from sortie.stacks.local.local_backend import LocalBackend
from sortie.stacks.local.processes import node_cgroups
from sortie.stacks.machine.loopback import RDZV_PORT_FLOOR, alive_now, ephemeral_port_range
from tests.helpers import loopback_listeners, needs_sshd, processes_mentioning, wait_until

pytestmark = [pytest.mark.e2e, needs_sshd]


def test_up_starts_one_sshd_per_node_on_loopback(backend: LocalBackend):
    inventory = backend.up("c-up", 3)
    addresses = {(n.address, n.port) for n in inventory.nodes}
    assert len(addresses) == 3
    assert all(n.address.startswith("127.") for n in inventory.nodes)
    assert addresses <= loopback_listeners()
    assert len({n.host_key for n in inventory.nodes}) == 3, "each node has its own host key"
    state = backend.state_dir("c-up")
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    for key in [state / "client_key", *state.glob("nodes/*/ssh_host_ed25519_key")]:
        assert stat.S_IMODE(key.stat().st_mode) == 0o600, key
    for node in inventory.nodes:
        assert Path(node.workdir).is_dir()
    # torchrun's store listens on every address: its port is free on all of them, and outside
    # the ephemeral range another sortie's sshd or connections draw from.
    assert RDZV_PORT_FLOOR <= inventory.rdzv_port < ephemeral_port_range()[0]
    with socket.socket() as sock:
        sock.bind(("", inventory.rdzv_port))


def test_sshd_refuses_passwords_and_foreign_keys(backend: LocalBackend, tmp_path: Path):
    node = backend.up("c-auth", 1).head
    transport = paramiko.Transport((node.address, node.port))
    try:
        transport.start_client(timeout=10)
        with pytest.raises(paramiko.BadAuthenticationType) as refused:
            transport.auth_password(node.user, "hunter2")
        assert refused.value.allowed_types == ["publickey"]
        stranger = paramiko.Ed25519Key.from_private_key_file(str(_fresh_key(tmp_path)))
        with pytest.raises(paramiko.AuthenticationException):
            transport.auth_publickey(node.user, stranger)
    finally:
        transport.close()


def _fresh_key(tmp_path: Path) -> Path:
    import subprocess

    path = tmp_path / "stranger"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path


def test_down_stops_everything_and_is_idempotent(backend: LocalBackend):
    inventory = backend.up("c-down", 2)
    conn = ssh.connect(inventory.head)
    # A detached process on the node, as the trainer launch makes one: down must find it too.
    conn.run(f"cd {inventory.head.workdir}; setsid nohup sleep 600 > /dev/null 2>&1 < /dev/null &")
    conn.close()
    state = backend.state_dir("c-down")
    assert processes_mentioning(state)
    before = {(n.address, n.port) for n in inventory.nodes}

    report = backend.down("c-down")
    assert report.clean, report
    assert not state.exists()
    assert processes_mentioning(state) == []
    assert not before & loopback_listeners()

    again = backend.down("c-down")
    assert again.clean and again.removed == 0


def test_failed_up_leaves_nothing(backend: LocalBackend, monkeypatch: pytest.MonkeyPatch):
    from sortie.stacks.local import local_backend as stacks_local

    calls = {"n": 0}
    real_start = stacks_local.start_sshd

    def fail_on_second(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise stacks_local.SortieError("sshd on node-1 exited: simulated")
        return real_start(*args, **kwargs)

    monkeypatch.setattr(stacks_local, "start_sshd", fail_on_second)
    with pytest.raises(stacks_local.SortieError, match="simulated"):
        backend.up("c-half", 3)
    state = backend.state_dir("c-half")
    assert not state.exists()
    assert processes_mentioning(state) == []


def test_up_refuses_an_existing_cluster(backend: LocalBackend):
    backend.up("c-dup", 1)
    with pytest.raises(NameTakenError, match="already exists"):
        backend.up("c-dup", 1)
    assert backend.lost_nodes(backend.inventory("c-dup")).nodes == [], "the first one is untouched"


def test_falls_back_to_127_0_0_1_with_distinct_ports(backend: LocalBackend, monkeypatch):
    """Where 127.0.1.x cannot be bound, every node shares 127.0.0.1 on its own port."""
    from sortie.stacks.machine import loopback as stacks_loopback

    real_free_port = stacks_loopback.free_port

    def no_127_0_1(address: str) -> int:
        if address.startswith("127.0.1."):
            raise OSError(99, "Cannot assign requested address")
        return real_free_port(address)

    monkeypatch.setattr(stacks_loopback, "free_port", no_127_0_1)
    inventory = backend.up("c-fallback", 3)
    assert {n.address for n in inventory.nodes} == {"127.0.0.1"}
    assert len({n.port for n in inventory.nodes}) == 3
    for node in inventory.nodes:
        ssh.connect(node).close()  # each one is its own pinned sshd
    assert backend.down("c-fallback").clean


def test_ssh_reaches_a_node_through_a_known_hosts_path_with_a_space(tmp_path: Path):
    """A space in $SORTIE_HOME split OpenSSH's UserKnownHostsFile in two."""
    from sortie.bootstrap.ssh import openssh_args

    backend = LocalBackend(tmp_path / "home with space")
    node = backend.up("spaced", 1).head
    try:
        known_hosts = backend.state_dir("spaced") / "known_hosts"
        done = subprocess.run(["ssh", *openssh_args(node, known_hosts), "-o", "BatchMode=yes",
                               "--", node.address, "echo", "reached"],
                              capture_output=True, text=True, timeout=30,
                              env={**os.environ, "HOME": str(tmp_path)})
        assert done.returncode == 0 and done.stdout.strip() == "reached", done.stderr
    finally:
        assert backend.down("spaced").clean


T = TypeVar("T")


def _wait_for(find: Callable[[], T], what: str) -> T:
    """``find()``'s first true answer within 30 s (these processes start in milliseconds)."""
    return wait_until(find, 30, f"not within 30s: {what}", pause=0.05)


# Each test's job has a command line of its own: a second checkout's same test (CI beside a
# `make test`) ran the same `sleep` at the same time, and two were found.
PID = os.getpid()


def _by_command(text: str) -> list[psutil.Process]:
    return [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] and
            " ".join(p.info["cmdline"]) == text]


def test_down_stops_what_sortie_started_and_nothing_else(backend: LocalBackend,
                                                        tmp_path: Path):
    """Third review: `down` killed a user's `tail -f` of a cluster file, a shell `cd`'d into
    the cluster's directory and `sortie down`'s own caller there, and missed a job process
    that left with cwd=/ in a session of its own."""
    inventory = backend.up("dd", 1)
    state = backend.state_dir("dd")
    user_tail = subprocess.Popen(["tail", "-f", str(state / "nodes" / "node-0" / "sshd.log")],
                                 stdout=subprocess.DEVNULL)
    user_shell = subprocess.Popen(["sleep", "311"], cwd=state)
    try:
        # Its own duration, not one a second checkout's same test runs beside it (two were found).
        job = f"sleep 312.{PID}"
        conn = ssh.connect(inventory.head)
        conn.run(f"cd /; setsid nohup {job} > /dev/null 2>&1 < /dev/null &")
        conn.close()
        [escaped] = _wait_for(lambda: _by_command(job), "the job process started")
        daemon = int((state / "nodes" / "node-0" / "sshd.pid").read_text())
        assert escaped.cwd() == "/" and daemon not in {p.pid for p in escaped.parents()}
        down = subprocess.run(
            ["bash", "-c", f'cd "{state}" && "{sys.executable}" -m sortie down dd; '
             'echo "caller alive: $?"'], capture_output=True, text=True, timeout=120,
            env={**os.environ, "SORTIE_HOME": str(backend.home)})
        assert "caller alive: 0" in down.stdout, down.stdout + down.stderr
        assert "0 resources remain" in down.stdout, down.stdout
        assert not alive_now(escaped), "the detached job process was stopped"
        assert user_tail.poll() is None and user_shell.poll() is None, "the user's were not"
        assert not state.exists()
    finally:
        user_tail.kill()
        user_shell.kill()


@pytest.mark.skipif(os.geteuid() != 0, reason="a node's cgroup is made as root")
def test_a_job_that_sheds_its_tag_session_and_network_is_still_stopped(backend: LocalBackend):
    """Fourth review (issue 61), Medium 5: a job that dropped its tag, left its session,
    double-forked (and, in a cluster with its own network, re-entered the host's) survived
    `down`, which said "0 resources remain". Each node's processes are in a cgroup of its own
    now: found, killed and proven gone by it."""
    inventory = backend.up("esc", 1)
    state = backend.state_dir("esc")
    conn = ssh.connect(inventory.head)
    host_net = "nsenter --net=/proc/1/ns/net " if os.access("/proc/1/ns/net", os.R_OK) else ""
    conn.run(f"cd /; {host_net}env -u SORTIE_LOCAL_NODE setsid sh -c "
             f"'(sleep 314.{PID} > /dev/null 2>&1 < /dev/null &) &' > /dev/null 2>&1 < /dev/null")
    conn.close()
    [escaped] = _wait_for(lambda: _by_command(f"sleep 314.{PID}"), "the job process started")
    try:
        assert "SORTIE_LOCAL_NODE" not in escaped.environ()
        down = backend.down("esc")
        assert down.leftovers == [] and down.state_removed and not state.exists()
        assert not alive_now(escaped), "the job that left its session and tag was stopped"
    finally:
        escaped.kill()


@pytest.mark.skipif(os.geteuid() != 0, reason="a node's cgroup is made as root")
def test_a_cgroup_teardown_cannot_remove_is_named_once(backend: LocalBackend):
    """A node's cgroup still in use after `down` is one leftover, named once (a Ctrl-C's
    report named one twice: the booted nodes' listing and the sshd nodes' both found it).
    This test process joins the node's cgroup: teardown never stops its own caller."""
    backend.up("once", 1)
    [group] = node_cgroups(backend.state_dir("once"))
    assert group.path is not None
    ours = group.path.parent / _own_cgroup().lstrip("/")  # (in the same hierarchy)
    (group.path / "cgroup.procs").write_text(f"{os.getpid()}\n")
    try:
        down = backend.down("once")
        assert [left.resource for left in down.leftovers] == [str(group.path)], down.summary()
    finally:
        (ours / "cgroup.procs").write_text(f"{os.getpid()}\n")
    assert backend.down("once").leftovers == [] and not group.exists()


def _own_cgroup() -> str:
    """This process's cgroup (v2) path, as /proc/self/cgroup says it."""
    lines = Path("/proc/self/cgroup").read_text().splitlines()
    return next(line.split(":", 2)[2] for line in lines if line.startswith("0::"))


def test_reclaim_takes_one_node_and_its_detached_processes(backend: LocalBackend):
    inventory = backend.up("rc", 2)
    for node in inventory.nodes:
        conn = ssh.connect(node)
        conn.run(f"cd /; setsid nohup sleep 3{node.name[-1]}3.{PID} > /dev/null 2>&1 < /dev/null &")
        conn.close()
    [on_0] = _wait_for(lambda: _by_command(f"sleep 303.{PID}"), "node-0's process")
    [on_1] = _wait_for(lambda: _by_command(f"sleep 313.{PID}"), "node-1's process")
    assert on_1.pid in backend.reclaim("rc", "node-1")
    assert alive_now(on_0) and not alive_now(on_1), "only node-1's processes were taken"


def test_the_cluster_lock_refuses_a_second_job_and_goes_with_its_holder(backend: LocalBackend):
    """A held cluster runs one job at a time: a second exec is refused while the first holds
    the lock, and while a job runs whose controller is gone (its own `running` lock) on any
    node, or a setup does (fourth review, issue 61: only the head's jobs were seen, and an
    orphaned setup ran beside the next exec)."""
    inventory = backend.up("lk", 2)
    head, other = inventory.nodes
    first, second = ssh.connect(head), ssh.connect(head)
    on_other = ssh.connect(other)
    conns = {head.name: second, other.name: on_other}

    def lock(run_id: str) -> paramiko.Channel:
        return cluster_lock.lock_cluster(conns, inventory.nodes, run_id, "lk")

    try:
        held = cluster_lock.lock_cluster({head.name: first, other.name: on_other},
                                         inventory.nodes, "run-a", "lk")
        busy = cluster_lock.ClusterBusy
        with pytest.raises(busy, match=r"lk: another `sortie exec` \(run run-a\)"):
            lock("run-b")
        held.close()  # the first exec ended (or its controller died: its connection closed)
        deadline = time.monotonic() + 30
        while True:
            try:
                lock("run-b").close()
                break
            except cluster_lock.ClusterBusy:
                assert time.monotonic() < deadline, "the lock outlived its holder"
                time.sleep(0.05)
        # A job left running by a controller that died, on node-1 only (its own disk): it
        # holds its run's `running` lock there.
        rd = run_dir(other, "orphan-job")
        on_other.run(f"mkdir -p {rd}; cd /; setsid nohup flock {rd}/running sleep 321.{PID} "
                     "> /dev/null 2>&1 < /dev/null &")
        orphan = _wait_for(lambda: _by_command(f"sleep 321.{PID}"), "the job's lock taken")
        with pytest.raises(busy, match=r"lk: job orphan-job still runs on it \(node-1;"):
            lock("run-c")
        orphan[0].kill()
        # A setup left running: it holds the node's setup lock (as `setup_cache` runs it).
        own = node_layout.node_dir(head)
        first.run(f"mkdir -p {own}; cd /; setsid nohup flock -o {own}/setup.running "
                  f"sleep 322.{PID} > /dev/null 2>&1 < /dev/null &")
        setup = _wait_for(lambda: _by_command(f"sleep 322.{PID}"), "the setup's lock taken")
        _wait_for(lambda: [1] if (Path(own) / "setup.running").exists() else [], "its file")
        with pytest.raises(busy, match=r"lk: a setup still runs on node-0"):
            lock("run-d")
        setup[0].kill()
        _wait_for(lambda: [] if _by_command(f"sleep 322.{PID}") else [1], "the setup gone")
        lock("run-e").close()
    finally:
        for conn in (first, second, on_other):
            conn.close()


def test_logs_of_a_held_cluster_with_a_node_gone_say_so_and_show_the_others(
        backend: LocalBackend, sortie_home: Path, tmp_path: Path):
    """Third battery: `sortie logs` of a held cluster whose node did not answer ended in a
    paramiko traceback."""
    from sortie.fleet import node_access
    from sortie.fleet.held_state import record_last_run

    inventory = backend.up("lg", 2, held=True)
    record_last_run(backend.state_dir("lg"), "r1")
    run = Path(run_dir(inventory.nodes[0], "r1"))
    run.mkdir(parents=True)
    (run / "torchrun.log").write_text("step 1/3\n")
    backend.reclaim("lg", "node-1")
    found = {log.node: log for log in node_access.logs(sortie_home, "lg", None, tmp_path / "runs")}
    assert found["node-0"].text == "step 1/3\n" and found["node-0"].answered
    assert found["node-1"].text.startswith("[sortie: node-1 did not answer: "), found
    assert not found["node-1"].answered
    # Fourth review (issue 61), Low 17: and `sortie logs` exited 0 all the same.
    said = subprocess.run([sys.executable, "-m", "sortie", "logs", "lg"], capture_output=True,
                          text=True, timeout=120,
                          env={**os.environ, "SORTIE_HOME": str(sortie_home)})
    assert said.returncode == 1 and "node-0 | step 1/3" in said.stdout, said.stderr
