"""Clusters sortie did not create (`sortie attach`), through the real CLI.

The "hosts" are real OpenSSH daemons this test starts itself, outside the local backend, with
their own host keys and a login key of the test's: to sortie they are machines someone else
runs. Attach pins their keys (never on first use), preflight checks them, jobs run on them,
`down` detaches and leaves them running, `reap` never touches them.
"""

from __future__ import annotations

import getpass
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from sortie.infra.keys import fingerprint
from sortie.stacks.machine.loopback import find_sshd, free_port, keygen
from tests.helpers import (
    controller_output,
    exit_code,
    follow_until,
    needs_sshd,
    processes_mentioning,
    sortie,
    start_sortie,
    stop,
)

pytestmark = [pytest.mark.e2e, needs_sshd]


@dataclass
class Host:
    address: str
    port: int
    host_key: str  # its public host key
    base: Path  # where the hosts file says sortie may work (the machine's "disk")
    daemon: subprocess.Popen

    def listening(self) -> bool:
        with socket.socket() as sock:
            return sock.connect_ex((self.address, self.port)) == 0


@dataclass
class Lab:
    """Machines sortie knows nothing about, and the key that logs in to them."""

    hosts: list[Host]
    client_key: Path
    root: Path

    def hosts_file(self, path: Path, **overrides: object) -> Path:
        """A hosts file for every host, each key pinned inline; ``overrides`` change the file's
        top level, or one host's fields as ``host1={...}``."""
        entries = [{"address": h.address, "port": h.port, "host_key": h.host_key,
                    "workdir": str(h.base)} for h in self.hosts]
        for index, entry in enumerate(entries):
            entry.update(overrides.pop(f"host{index}", {}))
            for key in [k for k, v in entry.items() if v is None]:
                del entry[key]
        document = {"identity_file": str(self.client_key), "python": sys.executable,
                    "rdzv_port": free_port("127.0.0.1"),
                    # the hosts share this machine's loopback, and the CPU: no GPU contention
                    "env": {"GLOO_SOCKET_IFNAME": "lo", "CUDA_VISIBLE_DEVICES": ""},
                    "hosts": entries, **overrides}
        path.write_text(yaml.safe_dump(document))
        return path


def _addresses(count: int) -> list[str]:
    wanted = [f"127.0.2.{i + 1}" for i in range(count)]
    try:
        for address in wanted:
            free_port(address)
    except OSError:
        return ["127.0.0.1"] * count
    return wanted


@pytest.fixture
def lab(tmp_path: Path, sortie_home: Path) -> Lab:
    root = tmp_path / "lab"
    root.mkdir()
    if os.geteuid() == 0:  # sshd started by root insists on it (a fresh machine has none)
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    keygen(root / "client_key", "the lab's login key")
    (root / "authorized_keys").write_text((root / "client_key.pub").read_text())
    hosts = []
    try:
        for index, address in enumerate(_addresses(2)):
            machine = root / f"host-{index}"
            (machine / "disk").mkdir(parents=True)
            (machine / "disk" / "theirs.txt").write_text("not sortie's\n")
            public = keygen(machine / "host_key", f"host-{index}")
            port = free_port(address)
            (machine / "sshd_config").write_text(textwrap.dedent(f"""\
                ListenAddress {address}:{port}
                HostKey {machine / 'host_key'}
                PidFile {machine / 'sshd.pid'}
                AuthorizedKeysFile {root / 'authorized_keys'}
                AllowUsers {getpass.getuser()}
                PasswordAuthentication no
                KbdInteractiveAuthentication no
                UsePAM no
                StrictModes no
                SetEnv SHLVL=1
                MaxStartups 64:30:128
                Subsystem sftp internal-sftp
                """))
            daemon = subprocess.Popen([find_sshd(), "-D", "-f", str(machine / "sshd_config"),
                                       "-E", str(machine / "sshd.log")],
                                      start_new_session=True, stdin=subprocess.DEVNULL)
            hosts.append(Host(address, port, public, machine / "disk", daemon))
        for host in hosts:
            for _ in range(200):
                if host.listening():
                    break
                subprocess.run(["sleep", "0.05"])
            assert host.listening(), f"sshd on {host.address}:{host.port} did not start"
        yield Lab(hosts, root / "client_key", root)
    finally:
        for host in hosts:
            stop(host.daemon)


def status(cwd: Path) -> list[dict]:
    done = sortie("status", "--json", cwd=cwd)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["sorties"]


def sortie_dirs(lab: Lab) -> list[str]:
    return sorted(p.name for h in lab.hosts for p in h.base.iterdir()
                  if p.name.startswith("sortie-"))


TRAIN = """\
import os
import re

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
tensor = torch.ones(1) * (dist.get_rank() + 1)
dist.all_reduce(tensor)
print(f"rank {dist.get_rank()} of {dist.get_world_size()} on node "
      f"{os.environ['SORTIE_NODE_RANK']}: sum {tensor.item():.0f}", flush=True)
os.makedirs(os.environ["SORTIE_ARTIFACT_DIR"], exist_ok=True)
with open(os.path.join(os.environ["SORTIE_ARTIFACT_DIR"], f"rank{dist.get_rank()}.txt"),
          "w") as out:
    out.write(str(tensor.item()))
dist.destroy_process_group()
"""


def test_hosts_are_pinned_checked_used_and_left_running(lab: Lab, tmp_path: Path,
                                                        sortie_home: Path):
    """The whole life of an attached cluster: a host without a key is refused, then refused
    with a wrong fingerprint, then accepted with the right one; a job runs; reap leaves it;
    down detaches: sortie's processes and files leave the nodes, the machines keep running."""
    second = lab.hosts[1]
    hosts = lab.hosts_file(tmp_path / "hosts.yaml", host1={"host_key": None})

    refused = sortie("attach", "lab", "--hosts", str(hosts), cwd=tmp_path)
    assert refused.returncode == 2, refused.stderr
    assert "never trusts a host on first use" in refused.stderr
    assert f"--trust {second.address}=SHA256:" in refused.stderr
    assert "ssh-keyscan" in refused.stderr and "Traceback" not in refused.stderr

    wrong = fingerprint(lab.hosts[0].host_key)
    refused = sortie("attach", "lab", "--hosts", str(hosts), "--trust",
                     f"{second.address}={wrong}", cwd=tmp_path)
    assert refused.returncode != 0
    assert f"presented {fingerprint(second.host_key)}, not {wrong}: refused" in refused.stderr
    assert status(tmp_path) == [] and sortie_dirs(lab) == [], "a refused attach left nothing"

    attached = sortie("attach", "lab", "--hosts", str(hosts), "--trust",
                      f"{second.address}={fingerprint(second.host_key)}", cwd=tmp_path)
    assert attached.returncode == 0, attached.stdout + attached.stderr
    assert "preflight of lab" in attached.stdout and "attached lab" in attached.stdout
    (row,) = status(tmp_path)
    assert (row["name"], row["backend"], row["source"], row["state"], row["nodes_up"]) == \
        ("lab", "attached", "hosts file", "up", 2)
    # The same machines under a second name, with the same rendezvous port on the same head:
    # its jobs and lab's would fight for the port.
    twice = sortie("attach", "lab2", "--hosts", str(hosts), "--trust",
                   f"{second.address}={fingerprint(second.host_key)}", cwd=tmp_path)
    assert twice.returncode == 2 and "is the rendezvous port of attached cluster lab too" in \
        twice.stderr, twice.stderr
    assert len(status(tmp_path)) == 1 and sortie_dirs(lab) == ["sortie-lab", "sortie-lab"]
    assert sortie_dirs(lab) == ["sortie-lab", "sortie-lab"]

    job = tmp_path / "job"
    job.mkdir()
    (job / "train.py").write_text(TRAIN)
    ran = sortie("exec", "lab", "--workdir", str(job), "--script", "train.py", "-p", "2",
                 "--runs-dir", str(tmp_path / "runs"), "--json", cwd=tmp_path)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    result = json.loads(ran.stdout)
    assert result["ranks"] == 4 and result["teardown"] is None
    assert "sum 10" in ran.stderr, "all four ranks on both hosts took part"
    artifacts = Path(result["artifacts"])
    assert sorted(p.name for p in artifacts.rglob("rank*.txt")) == \
        ["rank0.txt", "rank1.txt", "rank2.txt", "rank3.txt"]

    trained = sortie("run", "--on", "lab", "-p", "1", "--steps", "4", "--ckpt-every", "2",
                     "--runs-dir", str(tmp_path / "runs"), "--json", cwd=tmp_path)
    assert trained.returncode == 0, trained.stdout + trained.stderr
    summary = json.loads(trained.stdout)["summary"]
    assert (summary["steps"], summary["world_size"]) == (4, 2), "the bundled trainer, kept"

    reaped = sortie("reap", cwd=tmp_path)
    assert reaped.returncode == 0 and reaped.stdout == "", reaped.stdout
    assert [r["name"] for r in status(tmp_path)] == ["lab"]

    unconfirmed = sortie("down", "lab", "--destroy-stack", cwd=tmp_path)  # no terminal here
    assert unconfirmed.returncode == 2 and "add --yes to confirm" in unconfirmed.stderr
    refused = sortie("down", "lab", "--destroy-stack", "--yes", cwd=tmp_path)
    assert refused.returncode == 2 and "not a Pulumi stack" in refused.stderr
    assert [r["name"] for r in status(tmp_path)] == ["lab"]

    # Detached from a second terminal while an exec runs (before: "✓ Training", then
    # "training failed on node-0 (exit unknown), …").
    (job / "task.yaml").write_text("workdir: .\nrun: echo waiting on $SORTIE_NODE_RANK; "
                                   "sleep 300\n")
    execd = start_sortie(tmp_path, "exec", "lab", str(job / "task.yaml"), "--runs-dir",
                         str(tmp_path / "runs"))
    seen: list[str] = []
    reader = follow_until(execd, seen, lambda line: "waiting on 1" in line)
    # Issue 66 (1) on hosts sortie did not make: a second exec waits its turn on their head,
    # and leaves the queue when cancelled (the lock and queue are files sortie keeps there).
    queued = sortie("exec", "lab", str(job / "task.yaml"), "-d", "--name", "next",
                    "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)
    assert queued.returncode == 0 and queued.stdout.startswith("next: queued on lab"), \
        queued.stdout + queued.stderr
    jobs = {j["id"]: j["state"] for j in json.loads(
        sortie("jobs", "lab", "--json", cwd=tmp_path).stdout)}
    assert jobs.get("next") == "queued" and "running" in jobs.values(), jobs
    left = sortie("cancel", "lab", "next", "--json", cwd=tmp_path)
    assert left.returncode == 0 and json.loads(left.stdout)["state"] == "interrupted", \
        left.stdout + left.stderr
    down = sortie("down", "lab", cwd=tmp_path)
    assert exit_code(execd, seen, 60) == 1, "".join(seen)
    reader.join(10)
    said = " ".join(controller_output(seen).split())
    assert "✗ Training" in said and "✓ Training" not in said, said
    assert "the cluster was detached (`sortie down`) while the job ran, which stopped it" in \
        said, said + "\n--- down said: " + down.stdout + down.stderr
    assert re.search(r"node-0 │ - │ detached", said), said
    # Piped, a table is as wide as its content (before: 80 columns, the path cut with "…").
    # Nothing is collected from nodes that `down` is clearing (before: a race with it, at times
    # "NOT verified: node-1: hashing the artifacts failed").
    runs = re.escape(str(tmp_path / "runs"))
    assert re.search(rf"│ artifacts │ {runs}/[\w-]+ \(0 files", controller_output(seen)), said
    assert down.returncode == 0, down.stderr
    assert "lab: detached" in down.stdout
    assert "machines left running (not created by sortie)" in down.stdout
    assert all(host.listening() and host.daemon.poll() is None for host in lab.hosts)
    assert sortie_dirs(lab) == [], "sortie's workdirs are gone"
    assert all((h.base / "theirs.txt").read_text() == "not sortie's\n" for h in lab.hosts)
    left = processes_mentioning(lab.root)  # once: an sshd's title changes as clients come
    assert all("sshd" in process for process in left), f"only the hosts' sshd run: {left}"
    assert status(tmp_path) == []


def test_preflight_names_a_node_without_torch_and_one_that_cannot_reach_the_head(
        lab: Lab, tmp_path: Path):
    bare = tmp_path / "bare-python"  # a Python without torch
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    hosts = lab.hosts_file(tmp_path / "hosts.yaml",
                           host1={"python": str(bare / "bin" / "python")})
    failed = sortie("attach", "lab", "--hosts", str(hosts), cwd=tmp_path)
    assert failed.returncode == 1, failed.stderr
    assert f"node-1: torch is not installed for {bare}/bin/python" in failed.stderr
    assert "nothing was attached" in failed.stderr and "Traceback" not in failed.stderr
    assert status(tmp_path) == [] and sortie_dirs(lab) == []

    # A python that is not there: before, the workdir the check had just made stayed on the
    # node (the clean-up ran that same python).
    hosts = lab.hosts_file(tmp_path / "hosts.yaml", host1={"python": "/usr/bin/python3.99"})
    failed = sortie("attach", "lab", "--hosts", str(hosts), cwd=tmp_path)
    assert failed.returncode == 1 and "/usr/bin/python3.99 did not run" in failed.stderr
    assert status(tmp_path) == [] and sortie_dirs(lab) == []

    # The head's rendezvous address as the other nodes would use it: one nothing answers on
    # (on loopback: a test never sends anywhere off this machine).
    unreachable = "::1"  # the listener is IPv4 only: refused
    hosts = lab.hosts_file(tmp_path / "hosts.yaml", host0={"private_address": unreachable})
    failed = sortie("attach", "lab", "--hosts", str(hosts), "--json", cwd=tmp_path)
    assert failed.returncode == 1
    report = json.loads(failed.stdout)
    assert report["ok"] is False
    assert [n["reaches_head"] for n in report["nodes"]] == [False, False]
    assert f"node-1: cannot reach the head's rendezvous port {unreachable}:" in failed.stderr
    assert status(tmp_path) == [] and sortie_dirs(lab) == []


@pytest.mark.skipif(os.getuid() != 0, reason="plants a directory owned by another user (root)")
def test_a_workdir_another_user_made_first_is_refused(lab: Lab, tmp_path: Path):
    """Fourth review (issue 61): a `sortie-NAME/` with a `.sortie-attached` marker was adopted
    whoever had made it: in a base others can write in, another user could seed what the nodes
    run. Refused now, naming the node and the directory; nothing is attached or written."""
    planted = lab.hosts[1].base / "sortie-lab"
    (planted / "trainers").mkdir(parents=True)
    (planted / ".sortie-attached").write_text("lab\n")
    os.chown(planted, 65534, 65534)
    planted.chmod(0o777)
    try:
        hosts = lab.hosts_file(tmp_path / "hosts.yaml")
        failed = sortie("attach", "lab", "--hosts", str(hosts), cwd=tmp_path)
        assert failed.returncode == 1, failed.stderr
        assert (f"node-1: {planted} is not this user's own, or others can write in it: sortie "
                "works only in one it made") in " ".join(failed.stderr.split())
        assert status(tmp_path) == [] and sortie_dirs(lab) == ["sortie-lab"]
        assert sorted(p.name for p in planted.iterdir()) == [".sortie-attached", "trainers"]
    finally:
        shutil.rmtree(planted)


def test_a_cluster_whose_node_is_gone_is_kept_until_forgotten(lab: Lab, tmp_path: Path):
    """`down` cannot clean a node that is gone, so it keeps the cluster for a retry; `down
    --forget` lets it go without reaching the nodes, and says what may remain where."""
    hosts = lab.hosts_file(tmp_path / "hosts.yaml")
    assert sortie("attach", "lab", "--hosts", str(hosts), cwd=tmp_path).returncode == 0
    refused = sortie("down", "lab", "--forget", "--destroy-stack", cwd=tmp_path)
    assert refused.returncode == 2 and "--forget" in refused.stderr
    gone = lab.hosts[1]
    stop(gone.daemon)

    kept = sortie("down", "lab", cwd=tmp_path)
    assert kept.returncode == 1 and "node-1" in kept.stderr and "not reachable" in kept.stderr
    [row] = status(tmp_path)
    assert (row["name"], row["state"], row["nodes_up"]) == ("lab", "degraded", 1)
    assert sortie_dirs(lab) == ["sortie-lab"], "the reachable node was cleaned"

    forgotten = sortie("down", "lab", "--forget", "--json", cwd=tmp_path)
    assert forgotten.returncode == 0, forgotten.stderr
    report = json.loads(forgotten.stdout)
    assert report == {"cluster": "lab", "unchecked": [
        f"node-{i} ({h.address}): {h.base}/sortie-lab" for i, h in enumerate(lab.hosts)]}
    assert status(tmp_path) == [] and sortie_dirs(lab) == ["sortie-lab"]
    assert lab.hosts[0].listening(), "nothing was done to the machines"
    assert sortie("down", "lab", "--forget", cwd=tmp_path).returncode == 2, "already forgotten"


def outputs_for(lab: Lab, **changes: object) -> dict:
    """What `pulumi stack output --json --show-secrets` prints for a stack whose nodes are
    the lab's hosts."""
    outputs = {
        "cluster": "gpu-fleet", "cloud": "aws", "region": "us-east-1", "zone": "us-east-1a",
        "instance_type": "p4d.24xlarge", "gpus_per_node": 0, "ssh_user": getpass.getuser(),
        "workdir": str(lab.hosts[0].base), "python": sys.executable,
        "nodes": [{"name": f"node-{i}", "public_address": h.address,
                   "private_address": h.address, "host_key": h.host_key,
                   "host_key_fingerprint": fingerprint(h.host_key), "spot": False,
                   "ssh_port": h.port, "workdir": str(h.base)}
                  for i, h in enumerate(lab.hosts)],
        "bucket_url": f"file://{lab.root / 'bucket'}", "expires_at": "2026-12-01T00:00:00Z",
        "client_private_key": lab.client_key.read_text(),
        "train_env": {"GLOO_SOCKET_IFNAME": "lo", "CUDA_VISIBLE_DEVICES": ""},
        # A free port: the lab's addresses are every test session's (a second clone's tests
        # beside this one held 29400 on the same head; the preflight refused, rightly).
        "rdzv_port": free_port("127.0.0.1"),
    }
    outputs.update(changes)
    return outputs


def test_a_stacks_outputs_attach_its_nodes_with_their_keys(lab: Lab, tmp_path: Path):
    out = tmp_path / "outputs.json"
    bad = outputs_for(lab)
    bad["nodes"][1]["host_key_fingerprint"] = fingerprint(lab.hosts[0].host_key)
    out.write_text(json.dumps(bad))
    refused = sortie("attach", "fleet", "--outputs", str(out), cwd=tmp_path)
    assert refused.returncode == 2
    assert "nodes.1: host_key_fingerprint" in refused.stderr and "is not the fingerprint" \
        in refused.stderr

    out.write_text(json.dumps(outputs_for(lab, client_private_key="[secret]")))
    refused = sortie("attach", "fleet", "--outputs", str(out), cwd=tmp_path)
    assert refused.returncode == 2 and "--show-secrets" in refused.stderr

    out.write_text(json.dumps(outputs_for(lab)))
    attached = sortie("attach", "fleet", "--outputs", str(out), cwd=tmp_path)
    assert attached.returncode == 0, attached.stdout + attached.stderr
    (row,) = status(tmp_path)
    assert (row["backend"], row["source"], row["nodes_up"]) == ("attached", "outputs file", 2)
    state = Path(os.environ["SORTIE_HOME"]) / "attached" / "fleet"
    assert (state / "client_key").stat().st_mode & 0o077 == 0
    known = (state / "known_hosts").read_text()
    assert all(h.host_key in known for h in lab.hosts), "the stack's host keys are pinned"

    down = sortie("down", "fleet", cwd=tmp_path)
    assert down.returncode == 0 and "fleet: detached" in down.stdout, down.stderr
    assert all(host.listening() for host in lab.hosts) and sortie_dirs(lab) == []


@pytest.mark.skipif(shutil.which("pulumi") is None,
                    reason="the Pulumi CLI is not on PATH (it is not in any registry here); "
                           "this runs the real --pulumi-stack path where it is installed")
def test_attach_a_real_pulumi_stack(lab: Lab, tmp_path: Path):
    """A Pulumi YAML project whose stack exports the outputs' shape for the lab's hosts: `pulumi
    up` for real, then `sortie attach --pulumi-stack` reads them through the Automation API."""
    project = tmp_path / "project"
    project.mkdir()
    outputs = outputs_for(lab)
    key = outputs.pop("client_private_key")
    program = {"name": "attach-check", "runtime": "yaml",
               "outputs": {**outputs, "client_private_key": {"fn::secret": key}}}
    (project / "Pulumi.yaml").write_text(yaml.safe_dump(program))
    env = {"PULUMI_BACKEND_URL": f"file://{tmp_path}", "PULUMI_CONFIG_PASSPHRASE": "test"}
    for command in (["stack", "init", "lab"], ["up", "--yes", "--skip-preview"]):
        subprocess.run(["pulumi", *command], cwd=project, env={**os.environ, **env},
                       check=True, capture_output=True)
    attached = sortie("attach", "stack-lab", "--pulumi-stack", "lab", "--cwd", str(project),
                      cwd=tmp_path, env=env)
    assert attached.returncode == 0, attached.stdout + attached.stderr
    (row,) = status(tmp_path)
    assert (row["source"], row["nodes_up"]) == ("pulumi stack", 2)
    assert sortie("down", "stack-lab", cwd=tmp_path).returncode == 0
    assert sortie_dirs(lab) == []


def test_a_pulumi_stack_is_attached_and_destroyed_only_when_asked(tmp_path: Path,
                                                                   sortie_home: Path):
    """A stack someone stood up with `pulumi up` (here the in-repo stack double, whose machines
    are real sshd nodes): attached through the same path as `--pulumi-stack`; a plain `down`
    leaves every resource; `--destroy-stack` destroys it with proof and keeps the stack."""
    from sortie.core.progress import QuietReporter
    from sortie.fleet import registry
    from sortie.fleet.attach_cluster import AttachRequest, attach_stack
    from sortie.fleet.status import status as fleet_status
    from sortie.stacks.cloud.access import CloudAccess
    from sortie.stacks.profiles import apply_overrides, load_profile
    from tests.stack_double import DoubleCloud

    cloud = DoubleCloud(tmp_path)
    cloud.open("team-fleet").up(apply_overrides(load_profile("aws-p3-dev"), ("nodes=2",)))
    access = CloudAccess(stacks=cloud, sweep=cloud.sweep)
    created = dict(cloud.resources)

    report = attach_stack(sortie_home, AttachRequest("fleet"), "team-fleet", tmp_path,
                          QuietReporter(), stacks=cloud)
    assert report.ok, report.problems()
    (row,) = fleet_status(sortie_home).sorties
    assert (row.backend, row.source, row.nodes_up) == ("attached", "pulumi stack", 2)
    [detached] = [registry.teardown(sortie_home, registry.find(sortie_home, "fleet"))]
    assert detached.clean and detached.detached
    assert cloud.resources == created, "a plain down destroys nothing"

    attach_stack(sortie_home, AttachRequest("fleet"), "team-fleet", tmp_path, QuietReporter(),
                 stacks=cloud)
    detached, destroyed = registry.destroy_attached_stack(sortie_home, "fleet", access)
    assert detached.clean and destroyed.clean, destroyed.summary()
    assert destroyed.removed == len(created) and cloud.resources == {}
    assert "0 resources remain" in destroyed.summary()
    assert "team-fleet" in cloud.stacks, "the user's stack (and its config) stays"
    assert fleet_status(sortie_home).sorties == []


def test_two_hosts_sharing_one_file_system_each_keep_their_own_runs(lab: Lab, tmp_path: Path,
                                                                      sortie_home: Path):
    """Hosts that share a home (NFS, as a Slurm cluster's nodes do) share sortie's workdir
    there. Before: an `exec` failed with "a job of this run still runs here" (both nodes' jobs
    in one run directory) or "cannot unpack the trainer" (one node removing what the other
    unpacked). Now each node keeps its own runs and setup, the trainer is installed whole by
    whichever node renames it into place first, and `down` removes the one directory."""
    shared = lab.hosts[0].base
    hosts = lab.hosts_file(tmp_path / "hosts.yaml", host1={"workdir": str(shared)})
    attached = sortie("attach", "nfs", "--hosts", str(hosts), cwd=tmp_path)
    assert attached.returncode == 0, attached.stdout + attached.stderr
    job = tmp_path / "job"
    job.mkdir()
    (job / "train.py").write_text(TRAIN)
    (job / "task.yaml").write_text(
        "workdir: .\nscript: train.py\nprocs_per_node: 1\n"
        "setup: echo \"set up on node $SORTIE_NODE_RANK\" >> $SORTIE_WORKDIR/setups.txt\n")
    for _ in range(2):  # the second: setups cached per node, a new run beside the first
        ran = sortie("exec", "nfs", str(job / "task.yaml"), "--runs-dir", str(tmp_path / "runs"),
                     "--json", cwd=tmp_path)
        assert ran.returncode == 0, ran.stdout + ran.stderr
        assert "sum 3" in ran.stderr, "both ranks, one on each host, took part"
        artifacts = Path(json.loads(ran.stdout)["artifacts"])
        assert sorted(p.name for p in artifacts.rglob("rank*.txt")) == ["rank0.txt", "rank1.txt"]
    workdir = shared / "sortie-nfs"
    assert sorted(p.name for p in (workdir / "nodes").iterdir()) == ["node-0", "node-1"]
    assert all(len(list((workdir / "nodes" / n / "runs").iterdir())) == 2
               for n in ("node-0", "node-1")), "each node's two runs, in its own directory"
    setups = sorted((workdir / "job" / "setups.txt").read_text().splitlines())
    assert setups == ["set up on node 0", "set up on node 1"], "once per node, then cached"
    (trainers,) = list((workdir / "trainers").iterdir())
    assert (trainers / "trainer" / "__init__.py").is_file(), "one version, whole"
    assert not [p for p in (workdir / "trainers").iterdir() if p.name.startswith(".new")]
    down = sortie("down", "nfs", cwd=tmp_path)
    assert down.returncode == 0 and "nfs: detached" in down.stdout, down.stdout + down.stderr
    assert sortie_dirs(lab) == [] and (shared / "theirs.txt").read_text() == "not sortie's\n"
