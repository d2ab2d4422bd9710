"""What sortie costs on top of torchrun, on local nodes, through the real CLI (issue 36).

Measured side by side in one run (the machine is noisy: medians, and each anchor beside it):
- exec: `sortie exec` of a tiny job (init the process group, one all-reduce) on a held 2-node
  cluster, against the fair anchor: the same job started by hand as one `torchrun` agent per
  node (`--nnodes 2`, c10d rendezvous on the head). RESULT exec_overhead_s (median exec minus
  median bare; goal <= 0.5) and RESULT exec_vs_bare.
- run: a whole 2-node x 2-process sortie of the bundled trainer, 200 steps (`sortie run`: start
  nodes, SSH, checks, install, health gate, train, collect and verify, tear down), against the
  same training started by hand as two torchrun agents (RESULT run_vs_bare_multinode; goal <=
  1.10) and as one `torchrun --standalone --nproc-per-node 4` (RESULT vs_bare_torchrun); RESULT
  wall_s and RESULT overhead_s (the sortie's wall time minus the trainer's own training time;
  goal <= 12).

Each anchor twice: with torchrun's c10d rendezvous (the issue's anchor, what people type) and
with the static one sortie starts jobs with (node ranks given: c10d's join waits in one-second
polls); against the static anchor is sortie's own cost (RESULT exec_overhead_vs_static_s,
RESULT run_vs_bare_static). RESULT exec_sortie_own_s reads it off the nodes instead: the exec's
wall time before the job's launch and after its end (median), free of the job's own variance.
- queue (issue 66): an exec queued behind a 3 s job, from that job's end to the queued job's
  launch (RESULT queued_exec_start_s), beside the same exec on the idle cluster from its
  command to its launch (RESULT exec_start_s); RESULT queued_over_own_start_s, their
  difference (goal <= 1).
- repair (issue 66): a node's machine taken, then `sortie repair` until the cluster is healthy
  (RESULT repair_local_s), beside `sortie up` of one node (RESULT up_one_node_s); RESULT
  repair_vs_up (goal <= 1.5).

Execs 10 times (a job's start varies by up to 0.7 s run to run: the store's connect backoff),
runs 3 times, each beside its anchors; medians. `--quick`: 3 execs and one run,
for a look while working.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from sortie.bootstrap.node_layout import run_dir  # noqa: E402
from sortie.core.inventory import Inventory  # noqa: E402
from sortie.stacks.machine.loopback import rendezvous_port  # noqa: E402

STEPS, CKPT_EVERY = "200", "20"  # `sortie run`'s default checkpoint interval
TINY_JOB = """\
import torch.distributed as dist
dist.init_process_group("gloo")
import torch
t = torch.ones(1)
dist.all_reduce(t)
print("rank", dist.get_rank(), "sum", int(t.item()), flush=True)
dist.destroy_process_group()
"""
BARE_ENV = {"OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "PYTHONUNBUFFERED": "1"}


def sortie(home: Path, *args: str) -> tuple[float, subprocess.CompletedProcess]:
    env = {**os.environ, "SORTIE_HOME": str(home), "PYTHONPATH": str(REPO)}
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "sortie", *args], env=env,
                          capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        sys.exit(f"sortie {args[0]} failed ({done.returncode}): {done.stderr[-2000:]}")
    return wall, done


def bare_agents(nodes: int, procs: int, target: list[str], cwd: Path,
                rendezvous: str = "c10d") -> float:
    """One torchrun agent per "node", all on this machine, the rendezvous on the first: c10d
    (the issue's anchor, what people type) or static with node ranks given (as sortie starts
    jobs: c10d's join waits in one-second polls)."""
    # Below the kernel's ephemeral range, as sortie's own (an ephemeral port can be taken by
    # any outgoing connection while torch loads).
    endpoint = f"127.0.0.1:{rendezvous_port()}"
    env = {**os.environ, "PYTHONPATH": str(REPO), **BARE_ENV}
    started = time.perf_counter()
    agents = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nodes),
         "--nproc-per-node", str(procs), "--rdzv-backend", rendezvous, "--rdzv-endpoint",
         endpoint, "--rdzv-id", f"bench-{endpoint}",
         *(["--node-rank", str(rank)] if rendezvous == "static" else []), *target],
        cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        for rank in range(nodes)]
    for agent in agents:
        _, err = agent.communicate(timeout=600)
        if agent.returncode != 0:
            sys.exit(f"bare torchrun failed: {err.decode()[-2000:]}")
    return time.perf_counter() - started


def bare_standalone(out: Path) -> float:
    env = {**os.environ, "PYTHONPATH": str(REPO), **BARE_ENV}
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4",
         "-m", "trainer", "--steps", STEPS, "--ckpt-every", CKPT_EVERY, "--out", str(out)],
        env=env, capture_output=True, check=True)
    return time.perf_counter() - started


def job_span(home: Path, cluster: str, run_id: str) -> tuple[float, float]:
    """(when the job was launched on the first node, when it ended on the last), by the nodes'
    own files (`bootstrap/train.py`: the launch writes `pid`, the end `exit_code`)."""
    inventory = Inventory.load(home / "clusters" / cluster / "inventory.json")
    runs = [Path(run_dir(node, run_id)) for node in inventory.nodes]
    return (min((run / "pid").stat().st_mtime for run in runs),
            max((run / "exit_code").stat().st_mtime for run in runs))


def exec_side_by_side(tmp: Path, rounds: int) -> dict:
    """Exec walls, bare walls by rendezvous, sortie's own seconds in each exec (before the job's
    launch and after its end), the last exec's phase times."""
    home, work = tmp / "exec-home", tmp / "work"
    work.mkdir()
    (work / "job.py").write_text(TINY_JOB)
    sortie(home, "up", "--nodes", "2", "--name", "bench-exec")
    found: dict = {"execs": [], "own": [], "bares": {"c10d": [], "static": []}, "phases": {}}
    try:
        sortie(home, "exec", "bench-exec", "--workdir", str(work), "--script", "job.py")  # warm
        for _ in range(rounds):
            for rendezvous, walls in found["bares"].items():
                walls.append(bare_agents(2, 1, ["job.py"], work, rendezvous))
            started = time.time()
            wall, done = sortie(home, "exec", "bench-exec", "--workdir", str(work), "--script",
                                "job.py", "--runs-dir", str(tmp / "runs"), "--json")
            report = json.loads(done.stdout)
            launched, ended = job_span(home, "bench-exec", report["run_id"])
            found["execs"].append(wall)
            found["own"].append((launched - started) + (started + wall - ended))
            found["phases"] = report["phase_s"]
        found["queued"] = queued_start(home, "bench-exec", work, tmp / "runs", rounds)
        found["repair"] = repair_beside_up(home, "bench-exec", tmp, rounds)
    finally:
        sortie(home, "down", "bench-exec")
    return found


def repair_beside_up(home: Path, cluster: str, tmp: Path, rounds: int) -> dict:
    """Issue 66: a node lost (its machine taken), `sortie repair` until the cluster is healthy
    again, beside `sortie up` of one node (and its `down`, not timed): medians of ``rounds``."""
    from sortie.stacks.local.local_backend import LocalBackend

    repairs, ups = [], []
    for attempt in range(rounds):
        LocalBackend(home).reclaim(cluster, "node-1")
        wall, done = sortie(home, "repair", cluster)
        assert done.returncode == 0, done.stderr
        repairs.append(wall)
        wall, done = sortie(tmp / "up-home", "up", "--nodes", "1", "--name", f"one-{attempt}")
        assert done.returncode == 0, done.stderr
        ups.append(wall)
        sortie(tmp / "up-home", "down", f"one-{attempt}")
    return {"repair": repairs, "up": ups}


def queued_start(home: Path, cluster: str, work: Path, runs: Path, rounds: int) -> dict:
    """Issue 66: an exec queued behind another, from the first job's end (its last node's) to
    the queued job's launch (its first node's), beside the same exec's start on the idle
    cluster (from the command to the launch): medians of ``rounds``."""
    (work / "hold.yaml").write_text("workdir: .\nrun: sleep 3\n")
    (work / "quick.yaml").write_text("workdir: .\nrun: 'true'\n")
    env = {**os.environ, "SORTIE_HOME": str(home), "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "sortie", "exec", cluster, "--runs-dir", str(runs)]
    queued, alone = [], []
    for attempt in range(rounds):
        first, second = f"hold-{attempt}", f"queued-{attempt}"
        holding = subprocess.Popen([*command, str(work / "hold.yaml"), "--name", first],
                                   env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        inventory = Inventory.load(home / "clusters" / cluster / "inventory.json")
        while not all((Path(run_dir(node, first)) / "pid").exists() for node in inventory.nodes):
            time.sleep(0.05)  # (the benchmark's own wait: the first job is running)
        subprocess.run([*command, str(work / "quick.yaml"), "--name", second], env=env,
                       capture_output=True, check=True)
        holding.wait()
        queued.append(job_span(home, cluster, second)[0] - job_span(home, cluster, first)[1])
        started = time.time()
        subprocess.run([*command, str(work / "quick.yaml"), "--name", f"alone-{attempt}"],
                       env=env, capture_output=True, check=True)
        alone.append(job_span(home, cluster, f"alone-{attempt}")[0] - started)
    return {"queued": queued, "alone": alone}


def run_side_by_side(tmp: Path, rounds: int) -> dict:
    walls, multinode, static, standalone, reports = [], [], [], [], []
    for attempt in range(rounds):
        out = tmp / f"bare-{attempt}"
        out.mkdir()
        standalone.append(bare_standalone(out / "standalone"))
        for rendezvous, anchor in (("c10d", multinode), ("static", static)):
            anchor.append(bare_agents(2, 2, [
                "-m", "trainer", "--steps", STEPS, "--ckpt-every", CKPT_EVERY, "--out",
                str(out / f"multinode-{rendezvous}")], out, rendezvous))
        wall, done = sortie(tmp / f"run-home-{attempt}", "run", "--nodes", "2",
                            "--procs-per-node", "2", "--steps", STEPS, "--ckpt-every",
                            CKPT_EVERY, "--runs-dir", str(tmp / "runs"), "--json")
        walls.append(wall)
        reports.append(json.loads(done.stdout))
    middle = sorted(range(rounds), key=lambda i: walls[i])[rounds // 2]  # the median run
    return {"walls": walls, "multinode": multinode, "static": static, "standalone": standalone,
            "report": reports[middle], "wall": walls[middle]}


def walls(values: list[float]) -> str:
    return ", ".join(f"{w:.2f}" for w in values) + "s"


def main() -> None:
    quick = "--quick" in sys.argv
    with tempfile.TemporaryDirectory(prefix="sortie-bench-") as tmp_name:
        tmp = Path(tmp_name)
        found = exec_side_by_side(tmp, 3 if quick else 10)
        run = run_side_by_side(tmp, 1 if quick else 3)
    execs, bares, exec_phases = found["execs"], found["bares"], found["phases"]
    exec_s = statistics.median(execs)
    bare_s, static_s = statistics.median(bares["c10d"]), statistics.median(bares["static"])
    print(f"exec {walls(execs)}; bare agents, c10d {walls(bares['c10d'])}; static "
          f"{walls(bares['static'])}")
    print("exec phases: " + ", ".join(f"{k} {v:.2f}s" for k, v in exec_phases.items()))
    print(f"sortie's own part of each exec (before the launch, after the end): "
          f"{walls(found['own'])}")
    report, wall = run["report"], run["wall"]
    for phase, seconds in report["phase_s"].items():
        print(f"run phase {phase:<8} {seconds:7.2f}s")
    print(f"run {walls(run['walls'])}; bare agents, c10d {walls(run['multinode'])}; static "
          f"{walls(run['static'])}; bare standalone {walls(run['standalone'])}")
    train_s = report["summary"]["train_time_s"]
    print(f"trainer's own time {train_s:.2f}s of {wall:.2f}s")
    # The anchor is c10d, what people type; sortie starts jobs with a static rendezvous
    # (bootstrap/train.py), so sortie's own cost is the figure against the static anchor.
    print(f"RESULT exec_overhead_s={exec_s - bare_s:.2f}")
    print(f"RESULT exec_vs_bare={exec_s / bare_s:.3f}")
    print(f"RESULT exec_overhead_vs_static_s={exec_s - static_s:.2f}")
    # The same, read off the nodes: the job's start varies by up to 0.7 s from run to run (the
    # store's connect backoff), which the difference of medians carries and this does not.
    print(f"RESULT exec_sortie_own_s={statistics.median(found['own']):.2f}")
    queued, alone = found["queued"]["queued"], found["queued"]["alone"]
    print(f"queued exec: first job's end to its launch {walls(queued)}; the same exec alone, "
          f"command to launch {walls(alone)}")
    print(f"RESULT queued_exec_start_s={statistics.median(queued):.2f}")
    print(f"RESULT exec_start_s={statistics.median(alone):.2f}")
    repairs, ups = found["repair"]["repair"], found["repair"]["up"]
    print(f"repair of a lost node {walls(repairs)}; up of one node {walls(ups)}")
    print(f"RESULT repair_local_s={statistics.median(repairs):.2f}")
    print(f"RESULT up_one_node_s={statistics.median(ups):.2f}")
    print(f"RESULT repair_vs_up={statistics.median(repairs) / statistics.median(ups):.2f}")
    print(f"RESULT queued_over_own_start_s="
          f"{statistics.median(queued) - statistics.median(alone):.2f}")
    print(f"RESULT run_vs_bare_multinode={wall / statistics.median(run['multinode']):.3f}")
    print(f"RESULT run_vs_bare_static={wall / statistics.median(run['static']):.3f}")
    print(f"RESULT wall_s={wall:.2f}")
    print(f"RESULT overhead_s={wall - train_s:.2f}")
    print(f"RESULT vs_bare_torchrun={wall / statistics.median(run['standalone']):.3f}")


if __name__ == "__main__":
    main()
