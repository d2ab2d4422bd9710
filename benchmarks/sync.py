"""The workdir sync (`bootstrap/sync.py`) to 8 local nodes, side by side with plain rsync.

A generated ~200 MB workdir (a few large files, a few thousand small ones) goes to 8 fresh local
nodes, alternately by sortie's sync and by plain parallel `rsync -a` processes, one per node,
over the same SSH transport (what SkyPilot does); each round to empty destinations. Then:
- sync_vs_rsync: median(sortie) / median(plain rsync) (target <= 1.1);
- resync_noop_s: a second sortie sync with nothing changed, over the connections `run` and
  `exec` hold (target <= 1.0 s; beside it, the same re-sync running rsync on every node);
- setup_cached_s: a cached setup on 8 nodes, i.e. what a cached setup adds before the job
  starts (target <= 0.5 s; measured at the setup step, `exec` is not there yet).
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sortie.bootstrap.prepare import prepare  # noqa: E402
from sortie.bootstrap.setup_cache import setup_all, setup_fingerprint  # noqa: E402
from sortie.bootstrap.ssh import on_all  # noqa: E402
from sortie.bootstrap.sync import ssh_transport, sync  # noqa: E402
from sortie.bootstrap.workdir import plan_sync  # noqa: E402
from sortie.core.inventory import Inventory  # noqa: E402
from sortie.core.job import Command, Job  # noqa: E402
from sortie.stacks.local.local_backend import LocalBackend  # noqa: E402

NODES, ROUNDS = 8, 3
LARGE = [40 << 20] * 4  # 160 MiB in four files
SMALL = 3000  # files of 2-20 KiB, ~33 MiB


def make_workdir(root: Path) -> Path:
    root.mkdir()
    for i, size in enumerate(LARGE):
        (root / f"weights-{i}.bin").write_bytes(os.urandom(size))
    for i in range(SMALL):
        folder = root / "src" / f"pkg{i % 30}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"mod{i}.py").write_bytes(os.urandom(2048 + (i * 97) % 18432))
    return root


def clear(inventory: Inventory, name: str) -> None:
    for node in inventory.nodes:
        shutil.rmtree(Path(node.workdir) / name, ignore_errors=True)


def plain_rsync(inventory: Inventory, workdir: Path, known_hosts: Path) -> float:
    started = time.perf_counter()
    on_all(inventory.nodes, lambda node: subprocess.run(
        ["rsync", "-a", "-e", ssh_transport(node, known_hosts), f"{workdir}/",
         f"{node.address}:{node.workdir}/plain/"], check=True, capture_output=True))
    return time.perf_counter() - started


def sortie_sync(inventory: Inventory, workdir: Path, state: Path,
                conns: dict | None = None) -> float:
    started = time.perf_counter()
    sync(inventory, plan_sync(workdir), state, conns=conns)
    return time.perf_counter() - started


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="sortie-bench-") as tmp:
        home = Path(tmp)
        workdir = make_workdir(home / "workdir")
        size = sum(p.stat().st_size for p in workdir.rglob("*") if p.is_file())
        backend = LocalBackend(home / "home")
        inventory = backend.up("bench", NODES)
        known_hosts = home / "known_hosts"
        known_hosts.write_text(inventory.known_hosts())
        try:
            ours, plain = [], []
            for round_ in range(ROUNDS):
                runs = [(ours, lambda r=round_: sortie_sync(inventory, workdir,
                                                            home / f"synced-{r}")),
                        (plain, lambda: plain_rsync(inventory, workdir, known_hosts))]
                for results, run in runs if round_ % 2 == 0 else reversed(runs):
                    clear(inventory, "job")
                    clear(inventory, "plain")
                    os.sync()
                    results.append(run())
            clear(inventory, "plain")
            sortie_sync(inventory, workdir, home / "synced-last")  # whatever the last round left
            # Without connections every node runs rsync; `run` and `exec` hold them (one round
            # trip per node then).
            noop_rsync = [sortie_sync(inventory, workdir, home / "synced-last")
                          for _ in range(3)]
            conns = prepare(inventory)
            noop = [sortie_sync(inventory, workdir, home / "synced-last", conns)
                    for _ in range(3)]

            job = Job(run_id="bench", procs_per_node=1, command=Command(run="true"))
            fingerprint = setup_fingerprint("true", {}, None, ())
            setup_all(conns, inventory, job, "true", fingerprint, {})  # the first: it runs
            cached = []
            for _ in range(3):
                started = time.perf_counter()
                ran = setup_all(conns, inventory, job, "true", fingerprint, {})
                cached.append(time.perf_counter() - started)
                assert not any(ran.values())
            for conn in conns.values():
                conn.close()
        finally:
            backend.down("bench")
    print(f"workdir: {size / 2**20:,.0f} MiB, {len(LARGE)} large + {SMALL} small files, "
          f"to {NODES} local nodes")
    print(f"sortie sync: {', '.join(f'{t:.2f}s' for t in ours)}; plain rsync -a: "
          f"{', '.join(f'{t:.2f}s' for t in plain)}")
    print(f"re-sync, nothing changed: {', '.join(f'{t:.3f}s' for t in noop)} (rsync on every "
          f"node: {', '.join(f'{t:.3f}s' for t in noop_rsync)}); cached setup: "
          f"{', '.join(f'{t:.3f}s' for t in cached)}")
    print(f"RESULT sync_vs_rsync={statistics.median(ours) / statistics.median(plain):.3f}")
    print(f"RESULT resync_noop_s={statistics.median(noop):.3f}")
    print(f"RESULT setup_cached_s={statistics.median(cached):.3f}")


if __name__ == "__main__":
    main()
