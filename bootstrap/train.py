"""Install the trainer on a node, launch torchrun detached from SSH, stream its log, stop it.

On every node, one run lives in ``<workdir>/runs/<run-id>/``: ``torchrun.log``, ``pid`` (the
process group of the detached launch), ``exit_code`` (written when torchrun ends) and ``out/``
(what the trainer writes; global rank 0 writes metrics and checkpoints there).
"""

from __future__ import annotations

import io
import shlex
import tarfile
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

from fabric import Connection

import trainer
from bootstrap.inventory import Inventory, Node
from bootstrap.ssh import NodeError, on_all, shell_env

LineSink = Callable[[str, str], None]  # (node name, line)
LAUNCH_TIMEOUT_S = 30  # starting a detached torchrun takes well under a second


@dataclass(frozen=True)
class TrainJob:
    run_id: str
    procs_per_node: int
    trainer_args: tuple[str, ...] = ()


def run_dir(node: Node, run_id: str) -> str:
    return f"{node.workdir}/runs/{run_id}"


def trainer_bundle() -> bytes:
    """The bundled trainer package as a tar, built once and sent to every node. Uncompressed:
    it is a few tens of KB, and `tar -z` would start a gzip process on every node."""
    package = Path(trainer.__file__).parent
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for source in sorted(package.glob("*.py")):
            tar.add(source, arcname=f"trainer/{source.name}")
    return buffer.getvalue()


def install_trainer(conn: Connection, node: Node, bundle: bytes) -> None:
    """Upload and unpack the trainer into the node's workdir (which the node check created)."""
    workdir = shlex.quote(node.workdir)
    conn.put(io.BytesIO(bundle), remote=f"{node.workdir}/trainer.tar")
    result = conn.run(f"cd {workdir} && rm -rf trainer && tar -xf trainer.tar && rm trainer.tar")
    if not result.ok:
        raise NodeError(f"{node.name}: installing the trainer failed: {result.stderr.strip()}")


def torchrun_command(node: Node, inventory: Inventory, job: TrainJob) -> str:
    """The same torchrun line on every node; c10d assigns node ranks at rendezvous."""
    out = f"{run_dir(node, job.run_id)}/out"
    env = {
        "PYTHONPATH": node.workdir,  # the uploaded trainer, not whatever the node has installed
        "PYTHONUNBUFFERED": "1",
        # torchrun's own default with several processes per node; set here to skip its banner.
        "OMP_NUM_THREADS": "1",
        # torch 2.13: restarted workers read stale addresses from a shared store (pytorch#135712).
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
        "SORTIE_RUN_ID": job.run_id,
        **inventory.train_env,
    }
    argv = [
        node.python, "-m", "torch.distributed.run",
        f"--nnodes={len(inventory.nodes)}",
        f"--nproc-per-node={job.procs_per_node}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={inventory.head.private_address}:{inventory.rdzv_port}",
        f"--rdzv-id={job.run_id}",
        f"--local-addr={node.private_address}",
        "--max-restarts=0",  # a failed attempt is sortie's to recover: it may replace a node
        "-m", "trainer", "--out", out, *job.trainer_args,
    ]
    return f"{shell_env(env)} {shlex.join(argv)}"


def launch(conn: Connection, node: Node, inventory: Inventory, job: TrainJob) -> None:
    """Start torchrun in its own session so that losing the SSH connection never stops it."""
    rd = shlex.quote(run_dir(node, job.run_id))
    wrapped = f"{torchrun_command(node, inventory, job)}; echo $? > {rd}/exit_code"
    # Separate statements: a trailing `&` would background a whole `a && b && c` list. A relaunch
    # after a recovery appends to the log and must not see the previous attempt's exit code.
    result = conn.run(
        f"mkdir -p {rd}/out && cd {shlex.quote(node.workdir)} || exit 1\n"
        f"rm -f {rd}/exit_code {rd}/out/preempted.json\n"
        f"setsid nohup bash -c {shlex.quote(wrapped)} >> {rd}/torchrun.log 2>&1 < /dev/null &\n"
        f"echo $! > {rd}/pid",
        timeout=LAUNCH_TIMEOUT_S,
    )
    if not result.ok:
        raise NodeError(f"{node.name}: launching torchrun failed: {result.stderr.strip()}")


def launch_all(conns: dict[str, Connection], inventory: Inventory, job: TrainJob) -> None:
    """Launch on every node (each launch returns within LAUNCH_TIMEOUT_S)."""
    on_all(inventory.nodes, lambda n: launch(conns[n.name], n, inventory, job))


class _LineWriter:
    """A file-like sink for Fabric's output streams that hands whole lines to a callback."""

    def __init__(self, node: str, sink: LineSink) -> None:
        self.node, self.sink, self.pending = node, sink, ""

    def write(self, data: str) -> None:
        self.pending += data
        *lines, self.pending = self.pending.split("\n")
        for line in lines:
            self.sink(self.node, line)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        if self.pending:
            self.sink(self.node, self.pending)
            self.pending = ""


def watch(conn: Connection, node: Node, run_id: str, sink: LineSink) -> int | None:
    """Stream the node's torchrun log until torchrun exits; return its exit code.

    None means torchrun ended without recording one (it was killed)."""
    rd = shlex.quote(run_dir(node, run_id))
    writer = _LineWriter(node.name, sink)
    conn.run(f"tail -n +1 -s 0.2 -F --pid=$(cat {rd}/pid) {rd}/torchrun.log 2>/dev/null",
             hide=False, out_stream=writer, err_stream=writer)
    writer.close()
    code = conn.run(f"cat {rd}/exit_code 2>/dev/null").stdout.strip()
    return int(code) if code.lstrip("-").isdigit() else None


def read_log(conn: Connection, node: Node, run_id: str) -> str:
    """The node's torchrun log of the run so far ("" when there is none)."""
    log = shlex.quote(f"{run_dir(node, run_id)}/torchrun.log")
    return conn.run(f"cat {log} 2>/dev/null").stdout


def progress(conn: Connection, node: Node, run_id: str) -> tuple[int | None, float | None]:
    """(exit code, seconds since the run last wrote its log or metrics) on this node, both by
    the node's own clock; None where there is none: torchrun still runs / nothing was written."""
    rd = shlex.quote(run_dir(node, run_id))
    result = conn.run(f"cat {rd}/exit_code 2>/dev/null || echo -\n"
                      f"newest=$(stat -c %Y {rd}/torchrun.log {rd}/out/metrics.jsonl 2>/dev/null"
                      " | sort -n | tail -1)\n"
                      'test -n "$newest" && echo $(( $(date +%s) - newest )) || echo -')
    code, idle = (result.stdout.split() + ["-", "-"])[:2]
    return (int(code) if code.lstrip("-").isdigit() else None,
            float(idle) if idle.lstrip("-").isdigit() else None)


def preempted(conn: Connection, node: Node, run_id: str) -> bool:
    """Whether the trainer stopped on this node for a preemption (rank 0 leaves a marker)."""
    marker = shlex.quote(f"{run_dir(node, run_id)}/out/preempted.json")
    return conn.run(f"test -f {marker}").ok


def stop(conn: Connection, node: Node, run_id: str, grace_s: float = 5.0) -> None:
    """SIGTERM the run's process group (torchrun forwards it to workers), SIGKILL after grace."""
    rd = shlex.quote(run_dir(node, run_id))
    ticks = max(1, int(grace_s * 10))
    conn.run(
        f"pid=$(cat {rd}/pid 2>/dev/null) || exit 0; kill -TERM -- -$pid 2>/dev/null || exit 0; "
        f"for i in $(seq {ticks}); do kill -0 -- -$pid 2>/dev/null || exit 0; sleep 0.1; done; "
        f"kill -KILL -- -$pid 2>/dev/null; exit 0"
    )


def watch_all(conns: dict[str, Connection], inventory: Inventory, run_id: str, sink: LineSink,
              failure_grace_s: float = 15.0) -> dict[str, int | None]:
    """Watch every node until its torchrun exits; return each node's exit code (None: unknown,
    e.g. a node there is no connection to).

    When one node fails, the others usually fail with it within seconds (their collectives
    break); any still running ``failure_grace_s`` later are stopped rather than left to hang."""
    pool = ThreadPoolExecutor(max_workers=len(inventory.nodes), thread_name_prefix="sortie-watch")
    futures = {pool.submit(watch, conns[n.name], n, run_id, sink): n for n in inventory.nodes
               if n.name in conns}
    codes: dict[str, int | None] = {}
    for node in inventory.nodes:
        if node.name not in conns:
            sink(node.name, "[sortie] not reachable over SSH")
    pending = set(futures)
    first_failure = time.monotonic() if len(futures) < len(inventory.nodes) else None
    try:
        while pending:
            done, pending = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
            for future in done:
                node = futures[future]
                try:
                    codes[node.name] = future.result()
                except Exception as exc:  # the connection broke: the node's fate is unknown
                    sink(node.name, f"[sortie] lost the node while watching: {exc}")
                    codes[node.name] = None
                if codes[node.name] != 0 and first_failure is None:
                    first_failure = time.monotonic()
            if pending and first_failure and time.monotonic() - first_failure > failure_grace_s:
                for future in pending:
                    node = futures[future]
                    sink(node.name, "[sortie] stopping: another node failed")
                    stop(conns[node.name], node, run_id)
                first_failure = float("inf")  # stop once
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    return {n.name: codes.get(n.name) for n in inventory.nodes}
