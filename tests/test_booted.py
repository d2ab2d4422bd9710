"""Booted local nodes (issue 49, first step): the image sortie builds with debootstrap, and one
node booted from it with systemd-nspawn in a network namespace of its own, cloud-init running the
user data it was handed through a NoCloud seed, sshd accepting with the host key it was given
(pinned: the client knows no other), then powered off with nothing left: no process, mount or
cgroup. Root and Debian's tools (debootstrap, systemd-container, zstd) are needed: `make test`
installs them as root; elsewhere these tests skip, saying why."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from sortie.core.errors import SortieError, UsageError
from sortie.stacks.booted.image import (
    CACHE_ENV,
    SUITE,
    build_image,
    cache_dir,
    current_image,
    image_name,
    images,
    mirror,
    unpack_image,
)
from sortie.stacks.booted.node import BootedNode
from sortie.stacks.machine.loopback import keygen
from sortie.stacks.machine.node_network import NETNS_DIR, NodeNetwork
from tests.helpers import needs_boot

BOOT_DEADLINE_S = 240  # ~3 s on a quiet machine; CI's is loaded


@pytest.mark.unit
def test_the_mirror_is_the_machines_own_in_either_format(tmp_path: Path):
    one_line = tmp_path / "sources.list"
    one_line.write_text("# a comment\ndeb [arch=amd64] http://mirror.example/debian/ bookworm "
                        "main\ndeb http://security.example/debian-security bookworm-security "
                        "main\n")
    assert mirror((one_line,)) == "http://mirror.example/debian"
    listed = tmp_path / "sources.list.d"
    listed.mkdir()
    (listed / "debian.sources").write_text(
        "Types: deb\nURIs: http://deb.example/debian\nSuites: bookworm bookworm-updates\n"
        "Components: main\n\nTypes: deb\nURIs: http://deb.example/debian-security\n"
        "Suites: bookworm-security\n")
    assert mirror((tmp_path / "none.list", listed)) == "http://deb.example/debian"
    assert mirror((tmp_path / "none.list",)) == "http://deb.debian.org/debian"


@pytest.mark.unit
def test_no_node_takes_the_clusters_registry_address():
    from sortie.stacks.machine.node_network import NAMESPACED_MAX_NODES, REGISTRY_ADDRESS

    last = NodeNetwork.address(NAMESPACED_MAX_NODES - 1)
    assert last == "10.77.0.253" and REGISTRY_ADDRESS == "10.77.0.254:5000"
    with pytest.raises(ValueError):
        NodeNetwork.address(NAMESPACED_MAX_NODES)


@pytest.mark.unit
def test_an_image_is_named_by_what_goes_into_it(monkeypatch: pytest.MonkeyPatch,
                                                tmp_path: Path):
    from sortie.stacks.booted import image as booted_image

    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    name = image_name()
    assert name.startswith(f"{SUITE}-") and name.endswith(".tar.zst")
    monkeypatch.setattr(booted_image, "PACKAGES", (*booted_image.PACKAGES, "strace"))
    assert image_name() != name, "another package: another image"
    changed = image_name()
    monkeypatch.setitem(booted_image.CONTAINER_FILES, "etc/containers/containers.conf", "")
    assert image_name() != changed, "another setting of its podman: another image"
    (tmp_path / f"{SUITE}-0123456789ab.tar.zst.part").write_text("a build cut short")
    assert images() == [] and current_image() is None


@pytest.mark.e2e
@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("zstd"),
                    reason="plants files owned by another user (root); zstd packs the image")
def test_an_image_another_user_could_have_put_or_changed_is_never_booted(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """Fourth review (issue 61), Medium 9: the cache's image was booted (as root, in every
    node) whoever owned it or could write to it, and whatever it held. Only this user's own
    file in this user's own directory, with the digest kept when it was built, is unpacked."""
    cache = tmp_path / "cache"
    monkeypatch.setenv(CACHE_ENV, str(cache))
    cache.mkdir(mode=0o700)
    tree = tmp_path / "tree"
    (tree / "etc").mkdir(parents=True)
    (tree / "etc" / "os-release").write_text("ID=debian\n")
    image = cache / image_name()
    subprocess.run(["sh", "-c", f'tar -C "{tree}" -cf - . | zstd -q -o "{image}"'], check=True)
    digest = image.with_name(image.name + ".sha256")
    digest.write_text(hashlib.sha256(image.read_bytes()).hexdigest() + "\n")
    found = current_image()
    assert found is not None
    unpack_image(found, tmp_path / "ok")
    assert (tmp_path / "ok" / "etc" / "os-release").read_text() == "ID=debian\n"

    image.chmod(0o666)  # anyone may change it
    assert current_image() is None
    with pytest.raises(SortieError, match="can be written by others"):
        unpack_image(found, tmp_path / "no1")
    image.chmod(0o644)
    os.chown(image, 65534, 65534)  # put there by another user
    assert current_image() is None
    with pytest.raises(SortieError, match="is not this user's own"):
        unpack_image(found, tmp_path / "no2")
    os.chown(image, 0, 0)
    with image.open("r+b") as changed:  # changed after it was built
        changed.seek(-1, os.SEEK_END)
        changed.write(b"\x00")
    with pytest.raises(SortieError, match="is not the image that was built here"):
        unpack_image(found, tmp_path / "no3")
    assert not (tmp_path / "no3").exists()
    cache.chmod(0o777)  # a cache others can write in
    with pytest.raises(UsageError, match=f"^{CACHE_ENV}: .* can be written by others"):
        build_image()
    monkeypatch.setenv(CACHE_ENV, "/etc/hostname/x")  # under a file: one line, no traceback
    with pytest.raises(UsageError, match=f"^{CACHE_ENV}: cannot make /etc/hostname/x"):
        build_image()


class BootedCluster:
    """One node booted from the image in a cluster's namespaces, and a second namespace on its
    bridge to reach it from (its address exists nowhere else)."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp = tmp_path
        self.state = tmp_path / "cluster"
        lower = self.state / "image"
        unpack_image(build_image(print), lower)  # built once per machine (minutes), then kept
        self.host_key = keygen(tmp_path / "host_key", "host")  # the node's: the client pins it
        self.client_key = keygen(tmp_path / "client_key", "client")
        self.network = NodeNetwork(self.state)
        self.node = BootedNode(name="node-0", machine=f"sortie-t{os.getpid()}-n0",
                               home=self.state / "nodes" / "node-0", image=lower,
                               netns=NETNS_DIR / self.network.namespace(0))
        try:  # the caller's `finally: stop()` starts only once this returns
            self.network.create()
            self.address = self.network.add_node(0)
            self.network.add_node(1)
        except BaseException:
            self.network.destroy()
            raise

    def boot(self, user_data: str, secrets: dict[str, str] | None = None) -> None:
        """Boot with ``user_data``; ``secrets``: files (path in the node: text) a cloud's
        secret store would hand its fetch command, put on its disk first."""
        self.node.mount()
        for path, text in (secrets or {}).items():
            where = self.node.root / path.lstrip("/")
            where.parent.mkdir(parents=True, exist_ok=True)
            where.write_text(text)
        self.node.seed(user_data, instance_id="i-test0")
        nspawn = self.node.boot()
        assert nspawn in self.node.pids(), "the container runs in the node's own cgroups"
        deadline = time.monotonic() + BOOT_DEADLINE_S
        while not self.node.booted() and self.node.running() and time.monotonic() < deadline:
            time.sleep(0.5)
        assert self.node.booted(), self.node.console.read_text(errors="replace")[-3000:]

    def ssh(self, command: str, user: str = "root") -> subprocess.CompletedProcess[str]:
        """``command`` on the node over SSH, the node's pinned key the only one trusted; tried
        until sshd answers (it starts once its key is there) or the deadline."""
        known_hosts = self.tmp / "known_hosts"
        known_hosts.write_text(f"{self.address} {self.host_key}\n")
        ssh = ["ip", "netns", "exec", self.network.namespace(1), "ssh", "-i",
               str(self.tmp / "client_key"), "-o", f"UserKnownHostsFile={known_hosts}",
               "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes",
               "-o", "ConnectTimeout=10", f"{user}@{self.address}", command]
        deadline = time.monotonic() + BOOT_DEADLINE_S
        while True:
            answered = subprocess.run(ssh, capture_output=True, text=True, timeout=60)
            if answered.returncode != 255 or time.monotonic() > deadline:
                return answered
            time.sleep(0.25)

    def log(self) -> str:
        return (self.node.root / "var/log/cloud-init.log").read_text(errors="replace")

    def stop(self) -> None:
        self.node.stop()
        self.network.destroy()
        assert not self.node.running() and not self.node.mounted()
        assert not any(group.exists() for group in self.node.cgroups())
        assert self.network.namespaces() == []


@pytest.mark.e2e
@needs_boot
@pytest.mark.timeout(1200)  # `make test` builds the image first; run alone, this builds it
def test_a_node_boots_runs_its_user_data_answers_with_its_pinned_key_and_leaves_nothing(
        tmp_path: Path):
    image = build_image(print)
    assert image.path.parent == cache_dir() and image.path.name == image_name()
    assert current_image() == image and image.size_bytes > 20 << 20
    cluster = BootedCluster(tmp_path)
    assert (cluster.node.image / "usr/bin/cloud-init").is_file()
    user_data = "#cloud-config\n" + yaml.safe_dump({
        "ssh_deletekeys": True,
        "ssh_keys": {"ed25519_private": (tmp_path / "host_key").read_text(),
                     "ed25519_public": cluster.host_key},
        "disable_root": False,
        "users": [{"name": "root", "ssh_authorized_keys": [cluster.client_key]}],
        "runcmd": [["sh", "-c", "echo ran > /run/sortie-user-data"]],
    })
    try:
        cluster.boot(user_data)
        assert cluster.node.cloud_init_errors() == []
        answered = cluster.ssh("cat /run/sortie-user-data; hostname; "
                               "cloud-init status --format json")
        assert answered.returncode == 0, answered.stderr
        ran, hostname, *status = answered.stdout.splitlines()
        assert (ran, hostname) == ("ran", cluster.node.machine)
        report = json.loads("\n".join(status))
        assert report["status"] == "done" and not report.get("errors"), report
        assert not schema_warnings(cluster), "no schema warning"
    finally:
        cluster.stop()


def schema_warnings(cluster: BootedCluster) -> list[str]:
    """What cloud-init's schema says of the node's user data (its log only says that it is
    invalid; `cloud-init schema --system` says why)."""
    if "Invalid cloud-config" not in cluster.log() and "schema errors" not in cluster.log():
        return []
    said = cluster.ssh("cloud-init schema --system 2>&1")
    return [line for line in said.stdout.splitlines() if line.strip()] or ["invalid"]


@pytest.mark.e2e
@needs_boot
@pytest.mark.timeout(1200)
def test_sorties_own_user_data_boots_a_node_with_its_pinned_key_ttl_and_python(tmp_path: Path):
    """What every cloud program hands its nodes (`infra/cloud_init.py`), booted: the host key
    fetched from a stand-in for the cloud's secret store (a file only root reads, as the
    cloud's command prints the key), the TTL timer armed, the Python link made; cloud-init
    ends `done` with no schema warning (before: `ssh_genkeytypes: [] is too short`)."""
    from sortie.infra.cloud_init import PYTHON_LINK, TTL_UNIT, render_cloud_init

    cluster = BootedCluster(tmp_path)
    secret = "/var/lib/secret-store/host-key"
    user_data = render_cloud_init(cluster.host_key, f"cat {secret}", ttl_hours=2,
                                  python_candidates=("/opt/conda/bin/python", "/usr/bin/python3"))
    # The login the programs give a node is the image's (cloud-init's default user); here root,
    # with the cluster's key, as a cloud's `ssh_authorized_keys`/key pair would install it.
    user_data += yaml.safe_dump({"disable_root": False, "users": [
        {"name": "root", "ssh_authorized_keys": [cluster.client_key]}]})
    try:
        cluster.boot(user_data, {secret: (tmp_path / "host_key").read_text()})
        assert cluster.node.cloud_init_errors() == [], cluster.log()[-3000:]
        answered = cluster.ssh(f"systemctl is-active {TTL_UNIT}.timer; cat {PYTHON_LINK}; "
                               "ls /etc/ssh/ | grep -c '^ssh_host_.*_key$'; "
                               "cat /etc/ssh/ssh_host_ed25519_key.pub; "
                               "cloud-init status --format json")
        assert answered.returncode == 0, answered.stderr
        timer, shebang, python, keys, public, *status = answered.stdout.splitlines()
        assert (keys, public) == ("1", cluster.host_key), "the pinned key, and no other"
        assert timer == "active"
        assert python == 'exec /usr/bin/python3 "$@"', "no torch here: the first that exists"
        assert json.loads("\n".join(status))["status"] == "done"
        assert schema_warnings(cluster) == []
    finally:
        cluster.stop()


@pytest.mark.e2e
@needs_boot
@pytest.mark.timeout(1200)
def test_a_failed_package_install_leaves_the_node_degraded_said_not_failed(tmp_path: Path):
    """A node that reaches no package mirror at first boot (a p4d before its Elastic IP): the
    package module fails, cloud-init's status is `error`, and before that read "cloud-init
    failed". Read from its result, it is one module that failed, not the node: said, and the
    node check follows; the host key came and sshd took us before it, the TTL is armed."""
    from sortie.bootstrap.checks import first_boot_status, read_first_boot
    from sortie.core.inventory import Node
    from sortie.infra.cloud_init import render_cloud_init

    cluster = BootedCluster(tmp_path)
    secret = "/var/lib/secret-store/host-key"
    user_data = render_cloud_init(cluster.host_key, f"cat {secret}", ttl_hours=2,
                                  python_candidates=("/usr/bin/python3",))
    user_data += yaml.safe_dump({"packages": ["sortie-no-such-package"], "disable_root": False,
                                 "users": [{"name": "root",
                                            "ssh_authorized_keys": [cluster.client_key]}]})
    node = Node(name="node-0", address=cluster.address, private_address=cluster.address,
                port=22, user="root", key_path="/k", host_key=cluster.host_key, workdir="/w",
                gpus=0)
    try:
        cluster.boot(user_data, {secret: (tmp_path / "host_key").read_text()})
        answered = cluster.ssh(first_boot_status(600))
        assert answered.returncode == 0, answered.stderr
        assert answered.stdout.startswith("ttl=armed\nstatus=1\n"), answered.stdout[:300]
        said = read_first_boot(node, answered.stdout, require_ttl=True)
        assert said.startswith("cloud-init: package_update_upgrade_install failed"), said
    finally:
        cluster.stop()


@pytest.mark.e2e
@needs_boot
@pytest.mark.timeout(1200)
def test_the_idle_stop_timer_powers_an_idle_node_off_by_itself(tmp_path: Path):
    """`sortie up --stack ... --idle-stop`'s in-guest half, booted: the every-minute check sees
    nothing at work (daemons are not work) and powers the node off once idle that long (here
    15 s with a check every 5 s, where a held cluster's is minutes with a check a minute: its
    first check starts the count, a later one ends it; issue 63: a minute's wait proved no
    more)."""
    from sortie.infra.cloud_init import IDLE_UNIT, render_cloud_init

    cluster = BootedCluster(tmp_path)
    secret = "/var/lib/secret-store/host-key"
    user_data = render_cloud_init(cluster.host_key, f"cat {secret}", ttl_hours=2,
                                  python_candidates=("/usr/bin/python3",),
                                  idle_stop_minutes=0.25, idle_check_s=5)
    user_data += yaml.safe_dump({"disable_root": False, "users": [
        {"name": "root", "ssh_authorized_keys": [cluster.client_key]}]})
    try:
        cluster.boot(user_data, {secret: (tmp_path / "host_key").read_text()})
        assert cluster.node.cloud_init_errors() == [], cluster.log()[-3000:]
        deadline = time.monotonic() + 300  # ~20 s, more on a loaded machine
        while cluster.node.running() and time.monotonic() < deadline:
            time.sleep(1)
        assert not cluster.node.running(), "idle for 15 s: powered off"
        journal = subprocess.run(["journalctl", "-D", str(cluster.node.root / "var/log/journal"),
                                  "-o", "cat", "--no-pager"], capture_output=True, text=True,
                                 timeout=60)
        said = journal.stdout  # (its console line goes to a console nspawn does not keep)
        assert IDLE_UNIT in said and "System Power Off" in said, said[-2000:]
        assert said.index(IDLE_UNIT) < said.rindex("System Power Off"), "the check, then off"
    finally:
        cluster.stop()
