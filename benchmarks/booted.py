"""Booted local nodes (issue 49): what the image costs to build and unpack, and how long one node
takes from `systemd-nspawn --boot` to sshd answering with its pinned key, running sortie's own
user data (`infra/cloud_init.py`: the host key fetched, the TTL armed, the Python probed).

Root and debootstrap, systemd-container, zstd. The build is timed into a scratch cache (a full
debootstrap from this machine's mirror, minutes); `--reuse` times the kept image's unpack and the
boots only. Prints:
    RESULT rootfs_build_s=<s>      (absent with --reuse)
    RESULT rootfs_unpack_s=<median s of 3>
    RESULT boot_to_ssh_s=<median s of 3, one node>
    RESULT booted_nodes_16_up_s=<s: `up` of 16 booted nodes until every one answers SSH>
    RESULT rehearsal_vs_local=<a 2-node bundled-trainer `run --stack aws-p4d --rehearse`'s
                               wall time over the same run on loopback sshd nodes>
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sortie.infra.cloud_init import render_cloud_init  # noqa: E402
from sortie.stacks.booted import image as booted_image  # noqa: E402
from tests.test_booted import BootedCluster  # noqa: E402  (one node, as the tests boot it)

ROUNDS = 3
SECRET = "/var/lib/secret-store/host-key"


def build_s() -> float:
    """A full build into a scratch cache (the kept image is left as it is)."""
    with tempfile.TemporaryDirectory() as scratch:
        os.environ[booted_image.CACHE_ENV] = scratch
        try:
            started = time.perf_counter()
            booted_image.build_image(print)
            return time.perf_counter() - started
        finally:
            del os.environ[booted_image.CACHE_ENV]


def unpack_s(image: booted_image.Image) -> float:
    with tempfile.TemporaryDirectory() as scratch:
        started = time.perf_counter()
        booted_image.unpack_image(image, Path(scratch) / "root")
        return time.perf_counter() - started


def boot_to_ssh_s() -> float:
    """One node with sortie's user data: from boot to a command over SSH (pinned key)."""
    import yaml

    with tempfile.TemporaryDirectory() as scratch:
        cluster = BootedCluster(Path(scratch))
        user_data = render_cloud_init(cluster.host_key, f"cat {SECRET}", ttl_hours=1,
                                      python_candidates=("/usr/bin/python3",))
        user_data += yaml.safe_dump({"disable_root": False, "users": [
            {"name": "root", "ssh_authorized_keys": [cluster.client_key]}]})
        try:
            cluster.node.mount()
            where = cluster.node.root / SECRET.lstrip("/")
            where.parent.mkdir(parents=True)
            where.write_text((Path(scratch) / "host_key").read_text())
            cluster.node.seed(user_data, "i-bench")
            started = time.perf_counter()
            cluster.node.boot()
            answered = cluster.ssh("true")
            took = time.perf_counter() - started
            assert answered.returncode == 0, answered.stderr
            return took
        finally:
            cluster.stop()


def nodes_up_s(count: int) -> float:
    """`up` of ``count`` booted nodes (`SORTIE_LOCAL_NODES=booted`) until each answers SSH with
    its pinned key (sortie's own user data: the key fetched, the TTL armed, Python probed)."""
    from concurrent.futures import ThreadPoolExecutor

    from sortie.bootstrap.ssh import wait_for_ssh
    from sortie.stacks.local.local_backend import LocalBackend

    os.environ["SORTIE_LOCAL_NODES"] = "booted"
    try:
        with tempfile.TemporaryDirectory() as scratch:
            backend = LocalBackend(Path(scratch))
            started = time.perf_counter()
            try:
                inventory = backend.up("bench16", count)
                with ThreadPoolExecutor(count) as pool:
                    for conn in pool.map(lambda node: wait_for_ssh(node, 600), inventory.nodes):
                        conn.close()
                return time.perf_counter() - started
            finally:
                assert backend.down("bench16").clean
    finally:
        del os.environ["SORTIE_LOCAL_NODES"]


def run_s(*args: str) -> float:
    """A whole `sortie run` (2 nodes, the bundled trainer) in a scratch home; its wall time."""
    with tempfile.TemporaryDirectory() as scratch:
        env = {**os.environ, "SORTIE_HOME": str(Path(scratch) / "home"),
               "SORTIE_REHEARSE_DELAYS": "key=0"}
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "sortie", "run", "--steps", "60", *args],
                              cwd=scratch, env=env, capture_output=True, text=True, timeout=900)
        took = time.perf_counter() - started
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        return took


def main() -> None:
    reuse = "--reuse" in sys.argv[1:]
    booted_image.require_booted_host()
    if not reuse:
        built = build_s()
        print(f"image build (debootstrap, fixes, zstd): {built:.1f} s")
    image = booted_image.build_image(print)
    unpacks = [unpack_s(image) for _ in range(ROUNDS)]
    boots = [boot_to_ssh_s() for _ in range(ROUNDS)]
    print(f"unpack: {', '.join(f'{t:.1f}' for t in unpacks)} s; boot to SSH: "
          f"{', '.join(f'{t:.1f}' for t in boots)} s")
    if not reuse:
        print(f"RESULT rootfs_build_s={built:.1f}")
    up16 = nodes_up_s(16)
    print(f"16 booted nodes up and answering: {up16:.1f} s")
    rehearsed = run_s("--stack", "aws-p4d", "--rehearse")  # (aws-p4d: 2 nodes)
    loopback = run_s("--nodes", "2")
    print(f"2-node run: rehearsed (aws-p4d) {rehearsed:.1f} s, loopback nodes {loopback:.1f} s")
    print(f"RESULT rootfs_unpack_s={statistics.median(unpacks):.2f}")
    print(f"RESULT boot_to_ssh_s={statistics.median(boots):.2f}")
    print(f"RESULT booted_nodes_16_up_s={up16:.1f}")
    print(f"RESULT rehearsal_vs_local={rehearsed / loopback:.2f}")


if __name__ == "__main__":
    main()
