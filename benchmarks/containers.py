"""Jobs in a container image against the node's own Python, side by side in one run (issue 68):
a registry on loopback and the lab's torch image (`stacks/machine/image_lab.py`), local nodes
with rootful podman. Root only.

- ``container_run_vs_native``: a 2×2 `sortie run` of a DDP script (200 all-reduce steps) in the
  image over the same run in the node's Python, the image already on the machine (pulls are
  measured apart), median of alternating runs; goal ≤ 1.10.
- ``image_pull_parallel_vs_one``: the image phase of a run on 8 nodes over one on 1 node, every
  pull fetching it from the registry (gone from the nodes' store before each); goal ≤ 1.5.
- ``cached_image_exec_s``: seconds an `exec` on a held cluster takes in the image over the same
  exec in the node's Python, with the image on the nodes (no pull); goal ≤ 0.3.

    python benchmarks/containers.py [--rounds 3]"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sortie.stacks.booted.image import RUNTIME_PACKAGES, cache_dir, current_image  # noqa: E402
from sortie.stacks.machine.image_lab import ImageLab, Registry, missing_tools  # noqa: E402

SCRIPT = """import torch, torch.distributed as dist
dist.init_process_group("gloo")
x = torch.ones(1 << 16)
for _ in range(200):
    dist.all_reduce(x)
dist.destroy_process_group()
"""


def sortie(home: Path, cwd: Path, *args: str) -> tuple[float, subprocess.CompletedProcess]:
    env = {**os.environ, "SORTIE_HOME": str(home)}
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "sortie", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=900)
    if done.returncode:
        raise SystemExit(f"sortie {' '.join(args)} failed:\n{done.stdout[-3000:]}{done.stderr}")
    return time.perf_counter() - started, done


def run_vs_native(home: Path, work: Path, image: str, rounds: int) -> float:
    """Median wall of a 2×2 run in the image over the same run natively."""
    subprocess.run(["podman", "pull", "-q", image], check=True, capture_output=True)
    native, contained = [], []
    try:
        for i in range(rounds):
            base = ("run", "--nodes", "2", "-p", "2", "--workdir", str(work), "--script",
                    "train.py", "--no-collect")
            native.append(sortie(home, work, *base, "--name", f"n{i}")[0])
            contained.append(sortie(home, work, *base, "--image", image, "--name", f"c{i}")[0])
    finally:
        subprocess.run(["podman", "rmi", image], capture_output=True)
    print(f"2x2 run: native {statistics.median(native):.2f}s, in the image "
          f"{statistics.median(contained):.2f}s")
    return statistics.median(contained) / statistics.median(native)


def pull_phase(home: Path, work: Path, image: str, nodes: int, name: str) -> float:
    gone = subprocess.run(["podman", "image", "exists", image]).returncode != 0
    assert gone, f"{image} is on the machine already: the pull would not fetch it"
    _, done = sortie(home, work, "run", "--nodes", str(nodes), "-p", "1", "--workdir", str(work),
                     "--script", "train.py", "--image", image, "--name", name, "--no-collect",
                     "--health", "off")
    record = json.loads((work / "runs" / name / "run.json").read_text())
    return float(record["result"]["phase_s"]["image"])


def pull_parallel_vs_one(home: Path, work: Path, image: str, rounds: int) -> float:
    one, eight = [], []
    for i in range(rounds):  # each run's teardown removes what it pulled
        one.append(pull_phase(home, work, image, 1, f"p1-{i}"))
        eight.append(pull_phase(home, work, image, 8, f"p8-{i}"))
    print(f"image pull: 1 node {statistics.median(one):.2f}s, 8 nodes "
          f"{statistics.median(eight):.2f}s")
    return statistics.median(eight) / statistics.median(one)


def cached_exec_overhead(home: Path, work: Path, image: str, rounds: int) -> float:
    sortie(home, work, "up", "--nodes", "2", "--name", "held")
    native, contained = [], []
    try:
        exec_ = ("exec", "held", "--workdir", str(work), "--script", "train.py", "--no-collect",
                 "--health", "off")
        sortie(home, work, *exec_, "--image", image)  # the pull, once
        for _ in range(rounds):
            native.append(sortie(home, work, *exec_)[0])
            contained.append(sortie(home, work, *exec_, "--image", image)[0])
    finally:
        sortie(home, work, "down", "held")
    print(f"exec on a held cluster: native {statistics.median(native):.2f}s, in the cached "
          f"image {statistics.median(contained):.2f}s")
    return statistics.median(contained) - statistics.median(native)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    rounds = parser.parse_args().rounds
    base = current_image()
    if os.geteuid() != 0 or missing_tools() or base is None:
        raise SystemExit("root, podman, docker-registry and `sortie images --build` needed")
    lab = ImageLab(cache_dir().parent / "image-lab", base.path, RUNTIME_PACKAGES)
    with tempfile.TemporaryDirectory(prefix="sortie-bench-") as tmp, \
            Registry(Path(tmp) / "registry") as registry:
        image = lab.push(lab.torch_image(), registry, "torch:1")
        work = Path(tmp) / "work"
        work.mkdir()
        (work / "train.py").write_text(SCRIPT)
        home = Path(tmp) / "home"
        ratio = run_vs_native(home, work, image, rounds)
        pulls = pull_parallel_vs_one(home, work, image, rounds)
        overhead = cached_exec_overhead(home, work, image, rounds)
    print(f"RESULT container_run_vs_native={ratio:.3f}")
    print(f"RESULT image_pull_parallel_vs_one={pulls:.3f}")
    print(f"RESULT cached_image_exec_s={overhead:.3f}")


if __name__ == "__main__":
    main()
