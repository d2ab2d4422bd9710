"""One booted local node: the image (`booted/image.py`) booted with `systemd-nspawn --boot` in the
node's network namespace (`machine/node_network.py`), through an overlay of its own over the
cluster's
unpacked image, with cloud-init reading the node's user data from a NoCloud seed: a machine that
boots, runs its user data, starts sshd with the host key it was given, and powers off.

    <state>/nodes/<name>/upper, work   the overlay's writable layer (the node's own disk)
    <state>/nodes/<name>/root          what the container boots (the overlay, mounted)
    <state>/nodes/<name>/containers    its container runtime's store (`/var/lib/containers`)
    <state>/nodes/<name>/console.log   its console: systemd's and cloud-init's messages

Each container runs in cgroups of its own (`/sys/fs/cgroup/<hierarchy>/<machine>`, named
`sortie-…`): with ``--keep-unit`` nspawn stays in its caller's, so without them every node would
share the controller's, and stopping one could not be told from stopping all. Checked facts:
`booted-nodes-and-slurm.md`.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from sortie.core import statefile
from sortie.core.statefile import CorruptStateError
from sortie.stacks.booted.image import CONTAINER_STORE, USER_STORES, run_tool
from sortie.stacks.machine.node_cgroup import below, joining, pids_in, remove_released, wait_joined

CGROUP_ROOT = Path("/sys/fs/cgroup")
CGROUP_HIERARCHIES = ("unified", "systemd")  # hybrid: cgroup2 and systemd's own (named) v1
STOP_TIMEOUT_S = 30.0  # a container's poweroff takes ~2-4 s
KILL_TIMEOUT_S = 10.0  # after SIGKILL, until the kernel has reaped them
MOUNT_TIMEOUT_S = 30
MAX_RESULT_BYTES = 1 << 20  # cloud-init's result.json: a few hundred bytes
MACHINE_PREFIX = "sortie-"
# Without CAP_SYS_ADMIN, a node's root cannot remount what is bound into it read-only (the
# controller's Python) writable, nor mount anything else; without CAP_LINUX_IMMUTABLE it cannot
# make a file in the bucket undeletable to teardown. (A user namespace would contain it further:
# nspawn 252 cannot join a network namespace made outside one, as every node's is.)
DROPPED_CAPABILITIES = ("CAP_SYS_ADMIN", "CAP_LINUX_IMMUTABLE")


@dataclass(frozen=True)
class BootedNode:
    """Where one booted node lives and what it boots in."""

    name: str  # node-0
    machine: str  # the container's name and host name (unique on the machine)
    home: Path  # <state>/nodes/<name>
    image: Path  # the cluster's unpacked image: every node's lower, read-only layer
    netns: Path  # /run/netns/<namespace>: the node's network

    @property
    def root(self) -> Path:
        return self.home / "root"

    @property
    def container_store(self) -> Path:
        """What the node's podman keeps images in, bound at /var/lib/containers: a directory of
        this machine's disk, since overlay (podman's store) is not supported over the node's
        overlay, and vfs copies a whole image for every container (~18 s for torch's)."""
        return self.home / "containers"

    def user_store(self, uid: int) -> Path:
        """Where a login user's podman (rootless) keeps its images: its own directory in the
        node's container store (the image's `rootless_storage_path`)."""
        return self.container_store / USER_STORES / str(uid)

    @property
    def console(self) -> Path:
        return self.home / "console.log"

    def __post_init__(self) -> None:
        if not self.machine.startswith(MACHINE_PREFIX):  # its cgroups' names: sortie's own
            raise ValueError(f"a booted node's machine name starts {MACHINE_PREFIX!r}")

    def cgroups(self) -> list[Path]:
        return [CGROUP_ROOT / hierarchy / self.machine
                for hierarchy in CGROUP_HIERARCHIES if (CGROUP_ROOT / hierarchy).is_dir()]

    # -- its disk -------------------------------------------------------------------------------

    def mount(self) -> None:
        """The node's disk: a fresh overlay over the image, and an empty container store (a
        replaced node starts clean)."""
        self.unmount()
        for path in (self.home / "upper", self.home / "work", self.container_store, self.root):
            if path != self.root and path.exists():
                subprocess.run(["rm", "-rf", "--one-file-system", str(path)], check=True,
                               timeout=MOUNT_TIMEOUT_S)
            path.mkdir(parents=True, exist_ok=True)
        run_tool(["mount", "-t", "overlay", "overlay", "-o",
                  f"lowerdir={self.image},upperdir={self.home / 'upper'},"
                  f"workdir={self.home / 'work'}", str(self.root)], "mounting the node's disk",
                 MOUNT_TIMEOUT_S)

    def mounted(self) -> bool:
        return os.path.ismount(self.root)

    def unmount(self) -> None:
        """Its overlay, unmounted (lazily if something still holds it: never left behind)."""
        if self.mounted():
            done = subprocess.run(["umount", str(self.root)], capture_output=True,
                                  timeout=MOUNT_TIMEOUT_S)
            if done.returncode != 0:
                run_tool(["umount", "--lazy", str(self.root)], "unmounting the node's disk",
                         MOUNT_TIMEOUT_S)

    def seed(self, user_data: str, instance_id: str, public_keys: tuple[str, ...] = ()) -> None:
        """What cloud-init reads at boot: the NoCloud seed (the user data as a cloud's metadata
        service would hand it, and the key pair's public keys, which cloud-init gives the
        image's default user), and a machine-id of the node's own."""
        seed = self.root / "var/lib/cloud/seed/nocloud"
        seed.mkdir(parents=True, exist_ok=True)
        meta = {"instance-id": instance_id, "local-hostname": self.machine,
                **({"public-keys": list(public_keys)} if public_keys else {})}
        (seed / "meta-data").write_text(json.dumps(meta) + "\n")  # (JSON is YAML)
        (seed / "user-data").write_text(user_data)
        (self.root / "etc/machine-id").write_text(secrets.token_hex(16) + "\n")

    def write(self, path: str, content: str, mode: int = 0o644) -> None:
        """A file on the node's disk before it boots (what its image or its cloud puts there)."""
        where = self.root / path.lstrip("/")
        where.parent.mkdir(parents=True, exist_ok=True)
        where.write_text(content)
        where.chmod(mode)

    # -- its life -------------------------------------------------------------------------------

    def boot(self, read_only: tuple[tuple[Path, str], ...] = (),
             writable: tuple[tuple[Path, str], ...] = (),
             env: dict[str, str] | None = None, delay_s: float = 0.0) -> int:
        """Boot the container, detached; its nspawn's pid. Binds are (host path, path in the
        node): ``read_only`` e.g. the controller's Python environment for jobs that need torch,
        ``writable`` e.g. a cluster's bucket. ``env``: nspawn's own (not the container's).
        ``delay_s``: the machine starts that late (a slow boot, rehearsed)."""
        for group in self.cgroups():
            group.mkdir(exist_ok=True)
        command = ["sh", "-c", 'sleep "$0"; exec "$@"', f"{delay_s:g}",
                   "systemd-nspawn", "--boot", "--register=no", "--keep-unit", "--quiet",
                   f"--directory={self.root}", f"--machine={self.machine}",
                   f"--network-namespace-path={self.netns}", "--resolv-conf=off",
                   "--console=pipe", f"--drop-capability={','.join(DROPPED_CAPABILITIES)}",
                   "--tmpfs=/run/lock",  # systemd mounts it itself, with CAP_SYS_ADMIN
                   *(f"--bind-ro={host}:{inside}" for host, inside in read_only),
                   *(f"--bind={host}:{inside}" for host, inside in writable),
                   f"--bind={self.container_store}:{CONTAINER_STORE}"]
        self.home.mkdir(parents=True, exist_ok=True)
        procs = [group / "cgroup.procs" for group in self.cgroups()]
        with open(self.console, "ab") as console:
            process = subprocess.Popen(
                joining(procs, command),
                stdin=subprocess.DEVNULL, stdout=console, stderr=console, start_new_session=True,
                env={**(os.environ if env is None else env),
                     "SYSTEMD_NSPAWN_UNIFIED_HIERARCHY": "1"})
        wait_joined(process, procs)
        return process.pid

    def pids(self) -> set[int]:
        """Every process of the node: those in its cgroups (nspawn, the container's init and
        all it started)."""
        return pids_in(self._groups())

    def _groups(self) -> list[Path]:
        """The node's cgroups and all below them, deepest first."""
        return below(self.cgroups())

    def running(self) -> bool:
        return bool(self.pids())

    def _wait_gone(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while self.running() and time.monotonic() < deadline:
            time.sleep(0.05)

    @property
    def cloud_init_result(self) -> Path:
        """What cloud-init writes once its last stage ends, on the node's disk
        (``instance/boot-finished`` is behind an absolute link, which from here would name this
        machine's own /var/lib/cloud)."""
        return self.root / "var/lib/cloud/data/result.json"

    def booted(self) -> bool:
        """cloud-init has run every stage."""
        return self.cloud_init_result.is_file()

    def cloud_init_errors(self) -> list[str]:
        """What cloud-init's result says went wrong (empty: ``status: done``), read from the
        node's disk, which the node wrote: untrusted, a regular file read to a cap. A missing
        or unreadable result is itself an error."""
        try:
            data = statefile.read_json(self.cloud_init_result, MAX_RESULT_BYTES)
            return [str(error)[:300] for error in data["v1"]["errors"]][:20]
        except (OSError, CorruptStateError, KeyError, TypeError) as exc:
            return [f"no cloud-init result ({type(exc).__name__})"]

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> list[int]:
        """Power the node off (SIGTERM to nspawn: the container shuts down), then SIGKILL what
        is left; unmount its disk and remove its cgroups. Returns the pids that had to be
        killed. A node still waiting to boot (``delay_s``) is only killed."""
        booting = True
        for pid in self.pids():
            with contextlib.suppress(psutil.Error):
                if psutil.Process(pid).name() == "systemd-nspawn":
                    os.kill(pid, signal.SIGTERM)
                    booting = False
        if not booting:
            self._wait_gone(timeout_s)
        killed = sorted(self.pids())
        for pid in killed:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self._wait_gone(KILL_TIMEOUT_S)
        self.unmount()
        remove_released(self._groups)
        return killed

