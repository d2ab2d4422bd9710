"""What a job in an image left on the nodes this machine ran for a cluster, removed with it:
the cluster's containers (by its labels, its name's and its nodes' workdirs': a killed node
leaves its container behind, as a dead machine would not; another controller's cluster of the
same name is not this one) and the images sortie pulled or made there (`IMAGES_FILE`, written by the
nodes: never an image the machine had before). An image another container still uses stays."""

from __future__ import annotations

import subprocess
from pathlib import Path

from sortie.bootstrap.container import IMAGES_FILE, removal_script

REMOVE_TIMEOUT_S = 120.0


def image_listings(node_disks: list[Path]) -> list[Path]:
    """The ``images`` files of the nodes whose disks (workdirs) are ``node_disks``."""
    return sorted(path for disk in node_disks for path in disk.glob(f"nodes/*/{IMAGES_FILE}"))


def keep_listings(node_disk: Path, kept: Path) -> None:
    """Before a replaced node's disk goes: what it listed, appended to ``kept`` (the cluster's
    own list), for the cluster's teardown to remove."""
    listed = "".join(path.read_text() for path in image_listings([node_disk]))
    if listed:
        with kept.open("a") as out:
            out.write(listed)


def remove_images(cluster_id: str, node_disks: list[Path], kept: Path | None = None
                  ) -> list[str]:
    """Remove the cluster's containers and the images listed on its nodes' disks (and in
    ``kept``, replaced nodes' lists), where any node ran a job in an image; the images kept
    because another container uses them."""
    listings = image_listings(node_disks) + ([kept] if kept and kept.is_file() else [])
    if not listings:
        return []
    script = removal_script(cluster_id, [str(disk) for disk in node_disks],
                            [str(p) for p in listings])
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True,
                          timeout=REMOVE_TIMEOUT_S, check=False)
    return [line.split(" ", 1)[1] for line in done.stdout.splitlines() if line.startswith("kept ")]
