"""Slurm (issue 51): what sortie costs over Slurm's own way of running the same 2-node torchrun
job, measured side by side on a real Slurm (`stacks/slurm/slurm_lab.py`: Debian's munged,
slurmctld and two slurmd in network namespaces; root, `apt-get install slurm-wlm munge`).

The job: two torchrun agents (one process each, gloo) that all-reduce a tensor and exit. Prints:
    RESULT slurm_exec_overhead_s=<median of 3: `sortie exec` of the job on a held allocation
                                  minus the same job through one bare `srun` in it>
    RESULT slurm_run_vs_bare=<median of 3: a whole `sortie run --slurm` of the job (allocation
                              to teardown) over a bare `sbatch --wait` script that runs it>
    RESULT requeue_resume_s=<from the bundled trainer's stop at its time limit's signal
                             (checkpoint saved, job ended) to the resumed job's first step in a
                             new allocation, as the run's recovery line says it>
    RESULT slurmctld_rpcs_per_min_queued=<slurmctld's RPCs a minute (sdiag) while one sortie
                             waits in the queue behind a job holding every node, less the same
                             minute with nothing queued (issue 67: goal <= 20)>
    RESULT two_sorties_same_nodes=<1 when two sorties Slurm puts on the same nodes both train
                             (each its own rendezvous port), else 0>

`--queue-only`: only the last two.
"""

from __future__ import annotations

import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sortie.stacks.slurm.slurm_lab import SlurmLab, missing_tools  # noqa: E402

ROUNDS = 3
JOB = """import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(4) * dist.get_rank()
dist.all_reduce(t)
print("sum", t.tolist(), flush=True)
dist.destroy_process_group()
"""
# torchrun on one node of an allocation: its rank and the head's address from Slurm itself.
AGENT = ("head=$(scontrol show hostnames $SLURM_JOB_NODELIST | head -n 1); "
         "addr=$(scontrol show node $head -o | grep -o 'NodeAddr=[^ ]*' | cut -d= -f2); "
         "cd {work} && GLOO_SOCKET_IFNAME=eth-$(hostname) OMP_NUM_THREADS=1 {python} -m "
         "torch.distributed.run --nnodes=2 --nproc-per-node=1 --rdzv-backend=static "
         "--rdzv-endpoint=$addr:29500 --node-rank=$SLURM_NODEID "
         "--local-addr=$(hostname -I | cut -d' ' -f1) job.py")


class Bench:
    def __init__(self, lab: SlurmLab, root: Path) -> None:
        self.lab, self.root = lab, root
        self.work = root / "job"
        self.work.mkdir()
        (self.work / "job.py").write_text(JOB)
        (root / "shared").mkdir()
        self.agent = AGENT.format(work=self.work, python=sys.executable)

    def sortie(self, *args: str, timeout: float = 600) -> float:
        started = time.perf_counter()
        done = subprocess.run([*self.lab.login_prefix(), sys.executable, "-m", "sortie", *args],
                              env={**self.lab.environment(),
                                   "SORTIE_HOME": str(self.root / "home")},
                              cwd=self.root, capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise SystemExit(f"sortie {' '.join(args)} failed: {done.stderr[-2000:]}")
        return time.perf_counter() - started

    def bare(self, *argv: str) -> float:
        started = time.perf_counter()
        done = self.lab.login(*argv, check=False, timeout=600)
        if done.returncode != 0:
            raise SystemExit(f"{argv[0]} failed: {done.stdout[-1000:]} {done.stderr[-1000:]}")
        return time.perf_counter() - started

    def exec_overhead(self) -> float:
        # (the lab counts memory per CPU, as sites do: a held allocation is shaped at `up`)
        self.sortie("up", "--slurm", "lab", "--nodes", "2", "--name", "held",
                    "--cpus-per-task", "2")
        job = self.lab.login("squeue", "-h", "-n", "sortie-held", "-o", "%i").stdout.strip()
        ours, bare = [], []
        try:
            for _ in range(ROUNDS):  # alternated: the machine's load falls on both alike
                ours.append(self.sortie("exec", "held", "-p", "1", "--workdir", str(self.work),
                                        "--script", "job.py", "--runs-dir",
                                        str(self.root / "runs")))
                bare.append(self.bare("srun", f"--jobid={job}", "--overlap", "--nodes=2",
                                      "--ntasks-per-node=1", "bash", "-c", self.agent))
        finally:
            self.sortie("down", "held")
        print(f"exec: sortie {statistics.median(ours):.2f}s, bare srun "
              f"{statistics.median(bare):.2f}s")
        return statistics.median(ours) - statistics.median(bare)

    def run_vs_bare(self) -> float:
        ours, bare = [], []
        for _ in range(ROUNDS):
            ours.append(self.sortie("run", "--slurm", "lab", "--nodes", "2", "-p", "1",
                                    "--workdir", str(self.work), "--script", "job.py",
                                    "--runs-dir", str(self.root / "runs")))
            bare.append(self.bare("sbatch", "--wait", "--nodes=2", "--ntasks-per-node=1",
                                  f"--output={self.root}/bare-%j.out", "--wrap",
                                  f"srun bash -c {shlex.quote(self.agent)}"))
        print(f"run: sortie {statistics.median(ours):.2f}s, bare sbatch "
              f"{statistics.median(bare):.2f}s")
        return statistics.median(ours) / statistics.median(bare)

    def requeue_resume(self) -> float:
        """A 2-minute allocation: Slurm signals the bundled trainer 30 s before (up to 60 s
        sooner)."""
        proc = subprocess.Popen(
            [*self.lab.login_prefix(), sys.executable, "-m", "sortie", "run", "--slurm", "lab",
             "--nodes", "2", "-p", "1", "--time", "2", "--steps", "1000000", "--runs-dir",
             str(self.root / "runs"), "--name", "limit", "--", "--log-every", "1"],
            env={**self.lab.environment(), "SORTIE_HOME": str(self.root / "home")},
            cwd=self.root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        seen: list[str] = []
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                seen.append(line)
                # Said once the new allocation's job reported its first step: from the signalled
                # job's end (the trainer saved and stopped) to that step, in sortie's own clock.
                if found := re.search(r"recovery 1: .*?cost [\d.]+s of training \(([\d.]+)s "
                                      r"down", " ".join("".join(seen[-3:]).split())):
                    return float(found.group(1))
        finally:
            proc.send_signal(2)
            proc.communicate(timeout=120)
        raise SystemExit("the run ended before it resumed after its time limit: "
                         + "".join(seen)[-3000:])


    def rpcs(self) -> int:
        """slurmctld's RPCs since its counters were last reset, by every user (`sdiag`)."""
        shown = self.lab.login("sdiag").stdout
        by_user = shown.split("Remote Procedure Call statistics by user", 1)[-1]
        return sum(int(n) for n in re.findall(r"count:(\d+)", by_user.split("Pending RPC")[0]))

    def rpcs_per_min_queued(self, seconds: float = 60.0) -> float:
        """A minute idle, then a minute with a sortie queued behind a job holding every node."""
        self.lab.login("sdiag", "--reset")
        time.sleep(seconds)
        idle = self.rpcs()
        blocker = self.lab.login("sbatch", "--parsable", "--exclusive", "-N", "2",
                                 "--output=/dev/null", "--wrap", "sleep 600").stdout.strip()
        proc = subprocess.Popen(
            [*self.lab.login_prefix(), sys.executable, "-m", "sortie", "run", "--slurm", "lab",
             "--nodes", "2", "-p", "1", "--steps", "5", "--runs-dir", str(self.root / "runs")],
            env={**self.lab.environment(), "SORTIE_HOME": str(self.root / "home")},
            cwd=self.root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            time.sleep(10)  # queued by now: its first, quick polls are over
            self.lab.login("sdiag", "--reset")
            time.sleep(seconds)
            queued = self.rpcs()
        finally:
            self.lab.login("scancel", blocker)
            proc.wait(timeout=300)
        print(f"slurmctld RPCs in {seconds:.0f}s: {queued} with a sortie queued, {idle} idle")
        return (queued - idle) * 60.0 / seconds

    def two_sorties_same_nodes(self) -> int:
        """Two runs at once, one CPU a node each: Slurm packs them on the same nodes."""
        procs = [subprocess.Popen(
            [*self.lab.login_prefix(), sys.executable, "-m", "sortie", "run", "--slurm", "lab",
             "--nodes", "2", "-p", "1", "--steps", "20", "--runs-dir", str(self.root / "runs")],
            env={**self.lab.environment(), "SORTIE_HOME": str(self.root / "home")},
            cwd=self.root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for _ in range(2)]
        return int(all(proc.wait(timeout=600) == 0 for proc in procs))


def main() -> None:
    missing = missing_tools()
    if missing:
        raise SystemExit(f"a real Slurm needs {', '.join(missing)}")
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        lab = SlurmLab(root / "lab", nodes=2)
        lab.start()
        try:
            bench = Bench(lab, root)
            bench.sortie("attach", "lab", "--slurm", "--shared-dir", str(root / "shared"),
                         "--python", sys.executable)
            if "--requeue-only" in sys.argv:
                print(f"RESULT requeue_resume_s={bench.requeue_resume():.1f}")
                return
            rpcs, both = bench.rpcs_per_min_queued(), bench.two_sorties_same_nodes()
            print(f"RESULT slurmctld_rpcs_per_min_queued={rpcs:.0f}")
            print(f"RESULT two_sorties_same_nodes={both}")
            if "--queue-only" in sys.argv:
                return
            overhead = bench.exec_overhead()
            ratio = bench.run_vs_bare()
            resume = bench.requeue_resume()
        finally:
            lab.stop()
    print(f"RESULT slurm_exec_overhead_s={overhead:.2f}")
    print(f"RESULT slurm_run_vs_bare={ratio:.2f}")
    print(f"RESULT requeue_resume_s={resume:.1f}")


if __name__ == "__main__":
    main()
