"""A whole sortie on booted local nodes (`SORTIE_LOCAL_NODES=booted`): each node a container that
boots sortie's image and runs sortie's own user data (the host key from a stand-in secret store,
sshd only with it, the TTL timer, the Python probe), reached through its relay. The controller's
path is the cloud's: it waits for SSH through the boot, waits for cloud-init, checks, trains;
a node reclaimed mid-run (every process of its container killed at once, as a cloud takes a spot
machine) is replaced by a freshly booted one and training resumes from the last checkpoint; the
end leaves no container, relay, mount, cgroup or namespace."""

from __future__ import annotations

import json
import re
import shlex
import sys
import time
from pathlib import Path

import pytest

from sortie.stacks.booted.image import build_image
from sortie.stacks.booted.node import CGROUP_HIERARCHIES, CGROUP_ROOT
from sortie.stacks.booted.nodes import NODES_ENV, BootedNodes
from sortie.stacks.local.local_backend import LocalBackend
from sortie.stacks.machine.node_network import NETNS_DIR
from tests.helpers import (
    assert_nothing_left,
    exit_code,
    follow_until,
    loopback_listeners,
    needs_boot,
    processes_mentioning,
    reached_step,
    sortie,
    start_run,
    start_sortie,
)

pytestmark = [pytest.mark.e2e, needs_boot]


def booted_leftovers(state: Path) -> list[str]:
    """Anything of the cluster at ``state`` that the machine still has."""
    prefix = BootedNodes(state).network.prefix
    with open("/proc/self/mountinfo") as table:
        mounts = [line.split()[4] for line in table if line.split()[4].startswith(str(state))]
    groups = [str(g) for h in CGROUP_HIERARCHIES for g in (CGROUP_ROOT / h).glob(f"{prefix}-*")]
    namespaces = [str(n) for n in NETNS_DIR.glob(f"{prefix}-*")] if NETNS_DIR.is_dir() else []
    return mounts + groups + namespaces


@pytest.mark.timeout(900)
def test_a_sortie_on_booted_nodes_recovers_a_reclaimed_node_and_leaves_nothing(
        sortie_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    build_image(print)  # kept: `make test` built it
    monkeypatch.setenv(NODES_ENV, "booted")
    before = loopback_listeners()
    proc = start_run(tmp_path, "--nodes", "2", "-p", "1", "--steps", "200", "--ckpt-every",
                     "10", "--name", "boot", "--", "--log-every", "10")
    seen: list[str] = []
    reader = follow_until(proc, seen, reached_step(30))
    backend = LocalBackend(sortie_home)
    state = backend.state_dir("boot")
    inventory = backend.inventory("boot")
    assert inventory.booted and [n.private_address for n in inventory.nodes] == \
        ["10.77.0.1", "10.77.0.2"], "each node has its address inside the cluster's network"
    booted = BootedNodes(state)
    for index in (0, 1):
        node = booted.node(index)
        assert node.running() and node.booted() and node.cloud_init_errors() == []
    killed = backend.reclaim("boot", "node-1")
    assert len(killed) > 3, "the container's own processes, its nspawn and its relay"
    assert exit_code(proc, seen, 600) == 0, "".join(seen)[-4000:]
    reader.join(10)
    output = " ".join("".join(seen).split())
    recovery = re.search(r"recovery 1: replaced node-1 \(machine gone\); lost at step (\d+), "
                         r"resumed from step (\d+)", output)
    assert recovery, output[-3000:]
    assert int(recovery.group(2)) % 10 == 0 and int(recovery.group(2)) >= 10
    assert "step 200/200" in output
    assert booted_leftovers(state) == []
    assert_nothing_left(sortie_home, before)


@pytest.mark.timeout(600)
def test_a_held_booted_cluster_is_listed_reached_and_torn_down(
        sortie_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    build_image(print)
    monkeypatch.setenv(NODES_ENV, "booted")
    up = sortie("up", "--nodes", "2", "--name", "held", cwd=tmp_path, timeout=600)
    assert up.returncode == 0, up.stdout + up.stderr
    state = LocalBackend(sortie_home).state_dir("held")
    try:
        # Held once booted and checked (as a cloud's nodes): reached at once, cloud-init done.
        said = sortie("ssh", "held", "node-1", "--", "hostname; cloud-init status", cwd=tmp_path)
        assert said.returncode == 0, said.stderr
        assert said.stdout.split()[0] == BootedNodes(state).node(1).machine
        assert "status: done" in said.stdout
        [row] = json.loads(sortie("status", "--json", cwd=tmp_path).stdout)["sorties"]
        assert (row["name"], row["state"], row["nodes_up"]) == ("held", "up", 2)
        # Fourth review (issue 61): the node's root remounted the controller's Python, bound
        # read-only, writable and planted a .pth that the next `sortie` ran as root here.
        venv, planted = shlex.quote(sys.prefix), shlex.quote(f"{sys.prefix}/planted.pth")
        escape = sortie("ssh", "held", "node-0", "--",
                        f"mount -o remount,rw,bind {venv} {venv}; echo import os > {planted}; "
                        f"mount -t tmpfs none /mnt; touch {planted}", cwd=tmp_path)
        assert escape.returncode != 0
        assert "permission denied" in escape.stderr.lower() and "Read-only" in escape.stderr, \
            escape.stderr
        assert not Path(sys.prefix, "planted.pth").exists()
        # A job's files outside its workdir, on machines `down` destroys: named after the exec
        # (never collected), those written before it and the caches not (before: unsaid), in
        # $HOME, /tmp, /mnt and beside the workdir (`../`; before: neither looked in).
        older = sortie("ssh", "held", "node-0", "--", "touch /tmp/older.bin", cwd=tmp_path)
        assert older.returncode == 0, older.stderr
        writes = tmp_path / "writes"
        writes.mkdir()
        (writes / "task.yaml").write_text(
            "workdir: .\nrun: if [ $SORTIE_NODE_RANK = 0 ]; then mkdir -p ~/ckpt ~/.cache/x; "
            "head -c 3000 /dev/zero > ~/ckpt/model.pt; touch /tmp/out.bin ~/.cache/x/y "
            "outputs.txt; mkdir -p /mnt/nvme; head -c 100 /dev/zero > /mnt/nvme/opt.pt; "
            "head -c 2000 /dev/zero > ../beside.pt; fi\n")
        wrote = sortie("exec", "held", str(writes / "task.yaml"), "--name", "writes",
                       cwd=tmp_path)
        said_out = " ".join((wrote.stdout + wrote.stderr).split())
        assert wrote.returncode == 0, said_out
        assert ("! the job wrote 4 files outside its workdir, not collected (only the workdir "
                "is): /root/ckpt/model.pt (2.9 KiB, node-0), /root/sortie/beside.pt (2.0 KiB, "
                "node-0), /mnt/nvme/opt.pt (100 B, node-0) and 1 more; they stay on held until "
                "`sortie down` destroys its machines") in said_out, said_out
        record = json.loads((tmp_path / "runs" / "writes" / "run.json").read_text())
        assert sorted(record["result"]["left_on_nodes"]) == [
            "node-0: /mnt/nvme/opt.pt (100 bytes)", "node-0: /root/ckpt/model.pt (3000 bytes)",
            "node-0: /root/sortie/beside.pt (2000 bytes)", "node-0: /tmp/out.bin (0 bytes)"]
        assert (tmp_path / "runs" / "writes" / "artifacts" / "outputs.txt").exists()
        # Issue 66 (1) on booted nodes: an exec on the busy cluster waits its turn on the head
        # (the lock and queue are files in the node's own root), and leaves it when cancelled.
        task = tmp_path / "job" / "long.yaml"
        task.parent.mkdir()
        task.write_text("workdir: .\nrun: sleep 300\n")
        first = sortie("exec", "held", str(task), "-d", "--name", "first",
                       cwd=tmp_path)
        assert first.stdout.startswith("first: running on held"), first.stdout + first.stderr
        second = sortie("exec", "held", str(task), "-d", "--name", "second",
                        cwd=tmp_path)
        assert second.stdout.startswith("second: queued on held"), second.stdout + second.stderr
        for job in ("second", "first"):  # the queued one, then the running one
            gone = sortie("cancel", "held", job, "--json", cwd=tmp_path)
            assert gone.returncode == 0 and json.loads(gone.stdout)["state"] == "interrupted", \
                gone.stdout + gone.stderr
        # The first's sync deleted the last exec's task.yaml on the nodes. Before, with
        # rsync's --delete-missing-args, Debian's rsync 3.2.7-1+deb12u6 on the nodes refused it
        # ("protocol incompatibility", RsyncProject/rsync#910) and the exec failed.
        first_log = (sortie_home / "detached" / "first.log").read_text()
        assert "deleted 1: task.yaml on node-0, node-1" in first_log, first_log[-2000:]
    finally:
        Path(sys.prefix, "planted.pth").unlink(missing_ok=True)
        down = sortie("down", "held", cwd=tmp_path, timeout=300)
    assert down.returncode == 0 and "0 resources remain" in " ".join(down.stdout.split()), \
        down.stdout + down.stderr
    assert booted_leftovers(state) == [] and not state.exists()


@pytest.mark.timeout(600)
def test_an_up_killed_while_its_image_unpacks_is_reaped_without_a_trace(
        sortie_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Fourth review (issue 61), Medium 10: `kill -9` of `sortie up` while the cluster's image
    unpacked left the `tar` running, `down` and `reap` crashed (Errno 39: it still wrote), and
    the half-made cluster read "up" for ever, never reaped. The unpack carries the cluster's
    tag (stopped with it), and until it is held an `up` is driven by its process: killed, the
    cluster is an orphan that `reap` ends."""
    build_image(print)
    monkeypatch.setenv(NODES_ENV, "booted")
    before = loopback_listeners()
    up = start_sortie(tmp_path, "up", "--nodes", "1", "--name", "half")
    state = LocalBackend(sortie_home).state_dir("half")
    deadline = time.monotonic() + 120
    unpacking: list[str] = []
    while not unpacking and up.poll() is None and time.monotonic() < deadline:
        unpacking = [p for p in processes_mentioning(state) if " tar -C " in p]
        time.sleep(0.01)
    up.kill()
    up.wait(10)
    assert unpacking, "the image's unpack was seen running"
    [row] = json.loads(sortie("status", "--json", cwd=tmp_path).stdout)["sorties"]
    assert (row["name"], row["state"]) == ("half", "orphaned")
    reaped = sortie("reap", cwd=tmp_path, timeout=300)
    assert reaped.returncode == 0 and "Traceback" not in reaped.stderr, reaped.stderr
    assert reaped.stdout.startswith("half: nothing was trained on it") and \
        "0 resources remain" in reaped.stdout, reaped.stdout
    assert booted_leftovers(state) == [] and not state.exists()
    assert_nothing_left(sortie_home, before)
