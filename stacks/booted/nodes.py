"""Booted local nodes (`SORTIE_LOCAL_NODES=booted`): the local backend's nodes as machines that
boot, instead of one sshd process each. Each node is a container booted from sortie's image
(`booted/image.py`, `booted/node.py`) in its own network namespace
(`machine/node_network.py`), handed
sortie's own user data (`infra/cloud_init.py`, what every cloud program writes) through a NoCloud
seed: its pinned host key comes from a stand-in for a cloud's secret store, its sshd starts only
with that key, its TTL timer powers it off. The controller reaches it through a relay on a
loopback address (`booted/relay.py`), so everything after "provision" dials an address and a
port as on a cloud.

What a node gets from this machine, read-only: the controller's Python environment (the venv
and the Python it was made from: torch without a download). Read-write: the cluster's bucket
(checkpoints), at the same path as here, as a shared file system would be mounted.

    <state>/booted-image        the image the cluster boots (its name)
    <state>/image/              that image, unpacked: every node's read-only lower layer
    <state>/nodes/node-<i>/     its overlay (upper, work, root), console.log
"""

from __future__ import annotations

import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

from sortie.core import statefile
from sortie.core.errors import UsageError
from sortie.core.home import setting
from sortie.core.inventory import Node
from sortie.infra.cloud_home import Leftover, SshWait
from sortie.infra.cloud_home import home as cloud_home
from sortie.infra.cloud_init import PYTHON_LINK, render_cloud_init
from sortie.stacks.booted.cloud_rehearsal import (
    NOTICE_FILE,
    TLS_DIR,
    load_plan,
    make_tls,
    plan_rehearsal,
    prepare_rehearsed_node,
    rehearsed_env,
    save_plan,
    standin_config,
    write_key_pair,
)
from sortie.stacks.booted.image import (
    Image,
    current_image,
    require_booted_host,
    unpack_image,
)
from sortie.stacks.booted.node import CGROUP_HIERARCHIES, CGROUP_ROOT, BootedNode
from sortie.stacks.booted.relay import start_relay
from sortie.stacks.booted.standins import start_standins
from sortie.stacks.machine.held_limits import tag_of, tagged_env
from sortie.stacks.machine.loopback import keygen
from sortie.stacks.machine.node_network import NETNS_DIR, NodeNetwork

NODES_ENV = "SORTIE_LOCAL_NODES"  # sshd (the default) or booted
IMAGE_FILE = "booted-image"
USER = "root"  # the controller's venv is bound where it is here: under /root for a pyenv
WORKDIR = "/root/sortie"
SECRET = "/var/lib/sortie-secrets/host-key"  # the stand-in secret store: only root reads it
TTL_HOURS = 24.0  # a backstop: the controller (or `reap`) ends the cluster first
SSH_PORT = 22


def node_kind() -> str:
    """What $SORTIE_LOCAL_NODES asks for, checked (`require_booted_nodes`)."""
    kind = setting(NODES_ENV, ("sshd", "booted"))
    if kind == "booted":
        require_booted_nodes(f"{NODES_ENV}=booted")
    return kind


def require_booted_nodes(why: str) -> Image:
    """Booted nodes need root, Debian's tools and the image (`sortie images --build`): each
    said in one line naming ``why`` they are needed, before anything starts. The image."""
    require_booted_host()
    image = current_image()
    if image is None:
        raise UsageError(f"{why}: no image for booted nodes yet: build it once with "
                         "`sortie images --build` (a few minutes)")
    return image


def python_binds(environment_at: str | None = None) -> tuple[tuple[Path, str], ...]:
    """The controller's Python for a node: its environment (a venv) where it is here, or where
    a cloud's image has its own (``environment_at``), and the Python it was made from where it
    is (a venv names it by its path); never the system's /usr, which the node has of its own."""
    binds = [(Path(sys.prefix), environment_at or sys.prefix)]
    if sys.base_prefix != sys.prefix:
        binds.append((Path(sys.base_prefix), sys.base_prefix))
    return tuple((host, inside) for host, inside in binds if not str(host).startswith("/usr"))


class BootedNodes:
    """One local cluster's booted nodes, found from its state directory alone (so `down`
    cleans up after any process)."""

    def __init__(self, state: Path) -> None:
        self.state = state
        self.network = NodeNetwork(state)

    def used(self) -> bool:
        return (self.state / IMAGE_FILE).is_file()

    def prepare(self, rehearse: tuple[str, tuple[str, ...]] | None = None,
                cluster_id: str = "", nodes: int = 1) -> None:
        """The cluster's copy of the image, once, before its first node; rehearsing a cloud
        profile (``rehearse``: its name and `--set` overrides), its plan, the client key its
        program made, and the stand-ins' TLS."""
        image = require_booted_nodes("booted nodes")
        if rehearse is not None:
            profile, overrides = rehearse
            plan = plan_rehearsal(profile, (*overrides, f"nodes={nodes}"), cluster_id)
            save_plan(self.state, plan)
            make_tls(self.state, plan.hostnames)
            write_key_pair(self.state / "client_key", plan.client_private_key)
            (self.state / "bucket").chmod(0o1777)  # the login is not root: as /tmp
        tag = tag_of(self.state)
        unpack_image(image, self.state / "image", tagged_env(f"{tag}:image") if tag else None)
        (self.state / IMAGE_FILE).write_text(image.path.name + "\n")

    def node(self, index: int) -> BootedNode:
        return BootedNode(name=f"node-{index}", machine=self.network.namespace(index),
                          home=self.state / "nodes" / f"node-{index}",
                          image=self.state / "image",
                          netns=NETNS_DIR / self.network.namespace(index))

    def train_env(self) -> dict[str, str]:
        """A rehearsal's trainer environment from its program's outputs (`rehearsed_env`)."""
        plan = load_plan(self.state)
        return rehearsed_env(plan.train_env) if plan else {}

    def post_notice(self, index: int) -> None:
        """A spot notice for node ``index`` in its metadata service (its stand-ins read it on
        each request); a replacement node starts without one."""
        statefile.write_text(self.node(index).home / NOTICE_FILE, f"{time.time()}\n")

    def ssh_wait(self) -> SshWait:
        """How long a booted node may take to take SSH: a rehearsed cloud's (its delays are the
        cloud's), else a boot here and the stand-in key."""
        plan = load_plan(self.state)
        return cloud_home(plan.cloud).ssh_wait if plan else \
            SshWait(300, "boot, then the host key from the stand-in secret")

    def notice_s(self) -> float:
        """How long a rehearsed spot node lives after its notice (0: not a rehearsal)."""
        plan = load_plan(self.state)
        return plan.delays.notice if plan else 0.0

    def start(self, cluster_id: str, index: int, address: str, tag: str) -> Node:
        """Boot node ``index`` (its namespace exists) and its relay on ``address``: a new
        machine with a fresh disk. Its user data and host key: sortie's own and a fresh key
        (only the stand-in secret file and the controller's pin know it), or, rehearsing, the
        program's, with the cloud's stand-ins beside it."""
        node = self.node(index)
        node.home.mkdir(parents=True, exist_ok=True)
        node.mount()
        plan = load_plan(self.state)
        client_key = (self.state / "client_key.pub").read_text().strip()
        if plan is None:
            host_key = keygen(node.home / "ssh_host_ed25519_key", f"{cluster_id}-node-{index}")
            node.write(SECRET, (node.home / "ssh_host_ed25519_key").read_text(), 0o600)
            node.seed(self.user_data(host_key, client_key), f"{cluster_id}-{index}")
            login, workdir, python, delays = USER, WORKDIR, PYTHON_LINK, None
            binds = python_binds()
        else:
            rehearsed = plan.node(index)
            host_key, delays = rehearsed.host_key, plan.delays
            prepare_rehearsed_node(node, plan, self.state / TLS_DIR / "ca.pem")
            node.seed(rehearsed.user_data, f"{cluster_id}-{index}", (client_key,))
            login, workdir, python = plan.login_user, plan.workdir, plan.python
            binds = python_binds(plan.python_home)
        started = time.time()
        nspawn = node.boot(binds, writable=((self.state / "bucket", str(self.state / "bucket")),),
                           env=tagged_env(tag), delay_s=delays.boot if delays else 0.0)
        if plan is not None:
            self.network.add_metadata_address(index)
            config = node.home / "standins.json"
            statefile.write_text(config, standin_config(
                plan, index, cluster_id, self.state / TLS_DIR, node.home / NOTICE_FILE,
                grant_at=started + plan.delays.key).model_dump_json())
            config.chmod(0o600)
            start_standins(node.netns, config, nspawn, tag)
        port = start_relay(address, node.netns, (self.network.address(index), SSH_PORT),
                           nspawn, tag, attached_at=started + (delays.address if delays else 0))
        return Node(name=node.name, address=address, port=port, user=login,
                    key_path=self.state / "client_key", host_key=host_key, gpus=0,
                    private_address=self.network.address(index), workdir=workdir,
                    python=python)

    @staticmethod
    def user_data(host_key: str, client_key: str) -> str:
        """sortie's own user data, as every cloud program writes it, and the login a cloud's
        key pair would install (the image's user: root here)."""
        document = render_cloud_init(host_key, f"cat {SECRET}", ttl_hours=TTL_HOURS,
                                     python_candidates=(sys.executable,))
        return document + yaml.safe_dump({"disable_root": False, "users": [
            {"name": USER, "ssh_authorized_keys": [client_key]}]})

    def indexes(self) -> list[int]:
        nodes = self.state / "nodes"
        return sorted(int(p.name.removeprefix("node-")) for p in nodes.glob("node-*")
                      if p.name.removeprefix("node-").isdigit()) if nodes.is_dir() else []

    def stop(self, index: int | None = None) -> None:
        """Power node ``index`` off (every node: None), all at once; unmount their disks and
        remove their cgroups. Idempotent: a node already off is only cleaned up."""
        chosen = self.indexes() if index is None else [index]
        with ThreadPoolExecutor(max_workers=max(1, len(chosen))) as pool:
            list(pool.map(lambda i: self.node(i).stop(), chosen))

    def leftovers(self) -> list[Leftover]:
        """Mounts under the cluster's state and cgroups of its nodes still there."""
        root = f"{self.state.resolve()}/"
        with open("/proc/self/mountinfo") as table:
            mounts = [line.split()[4] for line in table]
        found = [Leftover("mount", m, f"umount --lazy {m}") for m in mounts
                 if m.startswith(root)]
        for hierarchy in CGROUP_HIERARCHIES:
            for group in (CGROUP_ROOT / hierarchy).glob(f"{self.network.prefix}-n*"):
                found.append(Leftover("cgroup", str(group), f"rmdir {group}"))
        return found
