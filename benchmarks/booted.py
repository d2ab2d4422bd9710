"""Booted local nodes (issue 49): what the image costs to build and unpack, and how long one node
takes from `systemd-nspawn --boot` to sshd answering with its pinned key, running sortie's own
user data (`infra/cloud_init.py`: the host key fetched, the TTL armed, the Python probed).

Root and debootstrap, systemd-container, zstd. The build is timed into a scratch cache (a full
debootstrap from this machine's mirror, minutes); `--reuse` times the kept image's unpack and the
boots only. Prints:
    RESULT rootfs_build_s=<s>      (absent with --reuse)
    RESULT rootfs_unpack_s=<median s of 3>
    RESULT boot_to_ssh_s=<median s of 3, one node>
The 16-node figure and the rehearsal against loopback nodes come with the booted backend.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sortie.infra.cloud_init import render_cloud_init  # noqa: E402
from sortie.stacks import booted_image  # noqa: E402
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
    print(f"RESULT rootfs_unpack_s={statistics.median(unpacks):.2f}")
    print(f"RESULT boot_to_ssh_s={statistics.median(boots):.2f}")


if __name__ == "__main__":
    main()
