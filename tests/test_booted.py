"""Booted local nodes (issue 49, first step): the image sortie builds with debootstrap, and one
node booted from it with systemd-nspawn in a network namespace of its own, cloud-init running the
user data it was handed through a NoCloud seed, sshd accepting with the host key it was given
(pinned: the client knows no other), then powered off with nothing left: no process, mount or
cgroup. Root and Debian's tools (debootstrap, systemd-container, zstd) are needed: `make test`
installs them as root; elsewhere these tests skip, saying why."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from sortie.stacks.booted_image import (
    CACHE_ENV,
    SUITE,
    build_image,
    cache_dir,
    current_image,
    image_name,
    images,
    mirror,
    missing_tools,
    unpack_image,
)
from sortie.stacks.booted_node import BootedNode
from sortie.stacks.loopback import keygen
from sortie.stacks.node_network import NETNS_DIR, NodeNetwork

NO_BOOT = ("booted nodes need root" if os.geteuid() != 0 else
           f"booted nodes need {', '.join(missing_tools())} (apt-get install)"
           if missing_tools() else None)
needs_boot = pytest.mark.skipif(NO_BOOT is not None, reason=str(NO_BOOT))
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
def test_an_image_is_named_by_what_goes_into_it(monkeypatch: pytest.MonkeyPatch,
                                                tmp_path: Path):
    from sortie.stacks import booted_image

    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    name = image_name()
    assert name.startswith(f"{SUITE}-") and name.endswith(".tar.zst")
    monkeypatch.setattr(booted_image, "PACKAGES", (*booted_image.PACKAGES, "strace"))
    assert image_name() != name, "another package: another image"
    (tmp_path / f"{SUITE}-0123456789ab.tar.zst.part").write_text("a build cut short")
    assert images() == [] and current_image() is None


@pytest.mark.e2e
@needs_boot
@pytest.mark.timeout(1200)  # `make test` builds the image first; run alone, this builds it
def test_a_node_boots_runs_its_user_data_answers_with_its_pinned_key_and_leaves_nothing(
        tmp_path: Path):
    image = build_image(print)  # built once per machine (minutes), then reused
    assert image.path.parent == cache_dir() and image.path.name == image_name()
    assert current_image() == image and image.size_bytes > 20 << 20

    state = tmp_path / "cluster"
    lower = state / "image"
    unpack_image(image, lower)
    assert (lower / "usr/bin/cloud-init").is_file()
    network = NodeNetwork(state)
    network.create()
    address = network.add_node(0)
    network.add_node(1)  # the client's side: the node's address exists only on the cluster's bridge
    node = BootedNode(name="node-0", machine=f"sortie-t{os.getpid()}-n0",
                      home=state / "nodes" / "node-0", image=lower,
                      netns=NETNS_DIR / network.namespace(0))
    host_key = keygen(tmp_path / "host_key", "host")  # the node's: the client pins it
    client_key = keygen(tmp_path / "client_key", "client")
    user_data = "#cloud-config\n" + yaml.safe_dump({
        "ssh_deletekeys": True,
        "ssh_keys": {"ed25519_private": (tmp_path / "host_key").read_text(),
                     "ed25519_public": host_key},
        "disable_root": False,
        "users": [{"name": "root", "ssh_authorized_keys": [client_key]}],
        "runcmd": [["sh", "-c", "echo ran > /run/sortie-user-data"]],
    })
    try:
        node.mount()
        node.seed(user_data, instance_id="i-test0")
        nspawn = node.boot()
        assert nspawn in node.pids(), "the container runs in the node's own cgroups"
        deadline = time.monotonic() + BOOT_DEADLINE_S
        while not node.booted() and node.running() and time.monotonic() < deadline:
            time.sleep(0.5)
        console = node.console.read_text(errors="replace")[-3000:]
        assert node.booted(), console
        assert node.cloud_init_errors() == [], console

        known_hosts = tmp_path / "known_hosts"
        known_hosts.write_text(f"{address} {host_key}\n")
        ssh = ["ip", "netns", "exec", network.namespace(1), "ssh", "-i",
               str(tmp_path / "client_key"), "-o", f"UserKnownHostsFile={known_hosts}",
               "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes",
               "-o", "ConnectTimeout=10", f"root@{address}"]
        answered = None
        while time.monotonic() < deadline:
            answered = subprocess.run([*ssh, "cat /run/sortie-user-data; hostname; "
                                       "cloud-init status --format json"],
                                      capture_output=True, text=True, timeout=60)
            if answered.returncode == 0:
                break
            time.sleep(1)
        assert answered is not None and answered.returncode == 0, answered.stderr
        ran, hostname, *status = answered.stdout.splitlines()
        assert (ran, hostname) == ("ran", node.machine)
        report = json.loads("\n".join(status))
        assert report["status"] == "done" and not report.get("errors"), report
        log = (node.root / "var/log/cloud-init.log").read_text(errors="replace")
        assert "Cloud config schema errors" not in log, "no schema warning"
    finally:
        node.stop()
        network.destroy()
    assert not node.running() and not node.mounted()
    assert not any(group.exists() for group in node.cgroups())
    assert network.namespaces() == []
