"""Jobs in a container image on booted nodes (issue 68): each node a machine of its own that
boots sortie's image, whose podman pulls the job's image from a registry on the cluster's own
network (Debian's docker-registry in the cluster's switch namespace, on the address the nodes'
image trusts, `node_network.REGISTRY_ADDRESS`) into the node's own store. A user's script 2×2
on a held cluster of a rehearsed cloud profile, as the cloud's login user (rootless podman),
then again with the image already there; the bundled trainer 2×2 as root through a lost node,
whose fresh replacement pulls the image again by digest; and nothing left: the nodes' stores go
with their disks."""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sortie.stacks.booted.cloud_rehearsal import DELAYS_ENV
from sortie.stacks.booted.nodes import NODES_ENV, BootedNodes
from sortie.stacks.local.local_backend import LocalBackend
from sortie.stacks.machine.image_lab import Registry
from sortie.stacks.machine.node_network import NETNS_DIR, REGISTRY_ADDRESS
from tests.helpers import (
    assert_nothing_left,
    exit_code,
    follow_until,
    needs_boot,
    reached_step,
    sortie,
    start_run,
)
from tests.test_booted_cluster import booted_leftovers
from tests.test_images import LAB, workdir
from tests.test_images import registry as loopback_registry  # noqa: F401 (a fixture)

pytestmark = [pytest.mark.e2e, needs_boot]
REHEARSED, LOGIN_USER = "aws-p3-dev", "ubuntu"  # a cloud profile, and the user its nodes log in as


@pytest.fixture
def booted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(NODES_ENV, "booted")


def image_in(loopback: Registry, as_name: str) -> str:
    """The lab's torch image pushed (to the loopback registry, whose storage a cluster's
    registry holds) as ``as_name``; its name as the cluster's nodes reach it."""
    LAB.push(LAB.torch_image(), loopback, as_name)
    return f"{REGISTRY_ADDRESS}/{as_name}"


@pytest.mark.timeout(1200)
def test_a_script_runs_in_the_image_as_a_clouds_login_user_and_then_from_the_nodes_stores(
        loopback_registry: Registry, sortie_home: Path, tmp_path: Path,  # noqa: F811
        monkeypatch: pytest.MonkeyPatch):
    """A held cluster of a cloud profile, rehearsed: the nodes are booted, and sortie logs in as
    the cloud's user, not root, whose podman runs rootless (in the subordinate IDs its
    `useradd` gave it), as a cloud node's would where its first boot installed podman."""
    monkeypatch.setenv(DELAYS_ENV, "key=3")
    image = image_in(loopback_registry, "torch-booted:1")
    up = sortie("up", "--stack", REHEARSED, "--set", "nodes=2", "--rehearse", "--name", "bheld",
                cwd=tmp_path, timeout=600)
    assert up.returncode == 0, up.stdout[-2000:] + up.stderr[-2000:]
    state = LocalBackend(sortie_home).state_dir("bheld")
    switch = BootedNodes(state).network.switch
    try:
        user = sortie("ssh", "bheld", "node-1", "--", "id -un; grep -c \"^$(id -un):\" "
                      "/etc/subuid", cwd=tmp_path)
        assert user.stdout.split() == [LOGIN_USER, "1"], user.stdout + user.stderr
        with Registry(tmp_path / "cluster-registry", switch=switch).holding(loopback_registry):
            code = workdir(tmp_path)
            first = sortie("exec", "bheld", "-p", "2", "--workdir", str(code), "--script",
                           "train.py", "--image", image, "--name", "first", cwd=tmp_path,
                           timeout=900)
            assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-2000:]
            out = " ".join(first.stdout.split())
            for rank in range(4):  # each node's podman ran its ranks in the image's Python
                assert f"rank {rank} python /opt/venv sum 6" in out, out[-3000:]
            used = json.loads((tmp_path / "runs" / "first" / "run.json").read_text()
                              )["result"]["image"]
            assert used["image"].startswith(f"{image.rsplit(':', 1)[0]}@sha256:")
            assert set(used["pulled_s"]) == {"node-0", "node-1"}, "each node its own store"
            assert (tmp_path / "runs" / "first" / "artifacts" / "outputs" / "model.pt"
                    ).read_text() == "weights"
            assert "level=warning" not in out, "the user's podman says nothing it need not"
            # The login user's podman keeps its own files in $HOME and /tmp: not the job's.
            assert "outside its workdir" not in out, out[-3000:]
        # The registry is gone: a second exec runs from what the nodes' stores kept.
        again = sortie("exec", "bheld", "-p", "2", "--workdir", str(code), "--script",
                       "train.py", "--image", used["image"], "--name", "again", cwd=tmp_path,
                       timeout=600)
        assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-2000:]
        assert "already on node-0, node-1" in " ".join(again.stdout.split())
    finally:
        down = sortie("down", "bheld", cwd=tmp_path, timeout=300)
    assert down.returncode == 0 and "0 resources remain" in " ".join(down.stdout.split()), \
        down.stdout + down.stderr
    assert booted_leftovers(state) == [] and not state.exists()
    assert_nothing_left(sortie_home)


class ClusterRegistry:
    """A registry that starts in a cluster's switch namespace as soon as `sortie run` makes it
    (the nodes boot for seconds before they pull), and stops with the test."""

    def __init__(self, root: Path, holding: Registry, switch: str) -> None:
        self.registry = Registry(root, switch=switch).holding(holding)
        self.started, self.ending = threading.Event(), threading.Event()
        self.failed: list[BaseException] = []
        self.thread = threading.Thread(target=self._start, args=(switch,), daemon=True)

    def _start(self, switch: str) -> None:
        deadline = time.monotonic() + 300
        while not self._switch_made(switch):
            if self.ending.is_set() or time.monotonic() > deadline:
                return  # the run ended (or never made its cluster): the test says so
            time.sleep(0.01)
        try:
            self.registry.start()
            self.started.set()
        except BaseException as exc:  # said by the test, which waits on `started`
            self.failed.append(exc)

    @staticmethod
    def _switch_made(switch: str) -> bool:
        """The switch namespace and its bridge, which the registry's address goes on."""
        return (NETNS_DIR / switch).exists() and subprocess.run(
            ["ip", "-n", switch, "link", "show", "br0"], capture_output=True).returncode == 0

    def __enter__(self) -> ClusterRegistry:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.ending.set()
        self.thread.join(60)
        self.registry.stop()


@pytest.fixture
def trainer_registry(loopback_registry: Registry, sortie_home: Path,  # noqa: F811
                     tmp_path: Path) -> Iterator[ClusterRegistry]:
    """The cluster's registry, holding the trainer's image, for the run named ``bimgrec``."""
    image_in(loopback_registry, "torch-booted-trainer:1")  # before its storage is linked
    switch = BootedNodes(LocalBackend(sortie_home).state_dir("bimgrec")).network.switch
    with ClusterRegistry(tmp_path / "cluster-registry", loopback_registry, switch) as started:
        yield started


@pytest.mark.timeout(900)
def test_the_bundled_trainer_in_the_image_on_booted_nodes_resumes_on_a_fresh_node(
        booted: None, loopback_registry: Registry, trainer_registry: ClusterRegistry,  # noqa: F811
        sortie_home: Path, tmp_path: Path):
    image = f"{REGISTRY_ADDRESS}/torch-booted-trainer:1"
    proc = start_run(tmp_path, "--nodes", "2", "-p", "2", "--steps", "100", "--ckpt-every",
                     "10", "--image", image, "--name", "bimgrec", "--", "--log-every", "10")
    seen: list[str] = []
    reader = follow_until(proc, seen, reached_step(30), timeout=600)
    assert trainer_registry.started.is_set(), trainer_registry.failed
    backend = LocalBackend(sortie_home)
    state = backend.state_dir("bimgrec")
    killed = backend.reclaim("bimgrec", "node-1")
    assert killed, "node-1 had processes to kill"
    assert exit_code(proc, seen, 600) == 0, "".join(seen)[-4000:]
    reader.join(10)
    output = " ".join("".join(seen).split())
    assert "Recovering from machine gone: replacing node-1" in output
    # The fresh node (an empty disk and store) pulled the head's digest again, alone.
    digest = re.search(rf"{re.escape(image.rsplit(':', 1)[0])}@(sha256:[0-9a-f]{{64}}) on 1 "
                       r"node .*pulled on node-1 ", output)
    assert digest, output[-3000:]
    summary = json.loads((tmp_path / "runs" / "bimgrec" / "artifacts" / "summary.json")
                         .read_text())
    assert summary["steps"] == 100 and summary["resumed_from"] >= 10
    assert booted_leftovers(state) == []
    assert_nothing_left(sortie_home)
