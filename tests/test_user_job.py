"""A user's own DDP script on a real 2-node x 2-process local cluster, through bootstrap: synced
workdir, cached setup, `script` (sortie writes the torchrun line) and `run` (the user writes it),
every rank told its place, and a secret that never shows in a process listing."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from sortie.bootstrap import node_layout, train
from sortie.bootstrap.node_layout import job_dir
from sortie.bootstrap.prepare import prepare
from sortie.bootstrap.setup_cache import setup_all, setup_fingerprint
from sortie.bootstrap.sync import sync
from sortie.bootstrap.workdir import plan_sync
from sortie.core.errors import SortieError
from sortie.core.inventory import Inventory
from sortie.core.job import Command, Job
from sortie.stacks.local.local_backend import LocalBackend
from tests.helpers import needs_sshd

pytestmark = [pytest.mark.e2e, needs_sshd]

SECRET = "s3cr3t-value-4417"
# What a tutorial's torchrun script does: init from the environment, all-reduce, write a file.
SCRIPT = """\
import json, os, sys, time
import torch, torch.distributed as dist
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
total = torch.tensor([float(rank)])
dist.all_reduce(total)
names = [n for n in os.environ if n.startswith("SORTIE_")] + ["MASTER_ADDR", "NODE_RANK"]
seen = {n: os.environ.get(n) for n in names}
seen.update(rank=rank, world=world, local_rank=int(os.environ["LOCAL_RANK"]), sum=total.item(),
            args=sys.argv[1:], token_ok=os.environ.get("MY_TOKEN") == EXPECTED,
            mode=os.environ.get("MODE"))
out = os.environ["SORTIE_ARTIFACT_DIR"]
with open(os.path.join(out, f"rank-{rank}.json"), "w") as f:
    json.dump(seen, f)
time.sleep(float(os.environ.get("HOLD_S", "0")))
dist.barrier()
dist.destroy_process_group()
""".replace("EXPECTED", repr(SECRET))


@pytest.fixture
def cluster(tmp_path: Path, backend: LocalBackend):
    inventory = backend.up("user-job", 2)
    conns = prepare(inventory)
    yield inventory, conns
    for conn in conns.values():
        conn.close()


def project(root: Path) -> Path:
    root.mkdir()
    (root / "train.py").write_text(SCRIPT)
    (root / "requirements.txt").write_text("numpy\n")
    (root / ".gitignore").write_text("*.secret\n")
    (root / "local.secret").write_text("never sent")
    return root


def ranks(inventory: Inventory, run_id: str) -> dict[int, dict]:
    found = {}
    for node in inventory.nodes:
        for path in Path(node_layout.artifact_dir(node, run_id)).glob("rank-*.json"):
            seen = json.loads(path.read_text())
            found[seen["rank"]] = {**seen, "node": node.name}
    return found


def run_job(inventory: Inventory, conns, job: Job, secrets: dict[str, str]
            ) -> tuple[dict[str, int | None], list[str]]:
    """Launch, list every process on the machine while the job runs, watch it to the end."""
    listings: list[str] = []
    train.launch_all(conns, inventory, job, secrets)

    def list_processes() -> None:
        time.sleep(2)
        listings.append(subprocess.run(["ps", "-eo", "args"], capture_output=True,
                                       text=True).stdout)
    lister = threading.Thread(target=list_processes)
    lister.start()
    lines: list[str] = []
    codes = train.watch_all(conns, inventory, job.run_id,
                            lambda node, line: lines.append(line)).codes
    lister.join()
    assert all(SECRET not in listing for listing in listings), "a secret in a command line"
    assert all(SECRET not in line for line in lines)
    return codes, lines


def test_script_and_run_jobs_see_their_place(tmp_path: Path, cluster):
    inventory, conns = cluster
    code = project(tmp_path / "project")
    sync(inventory, plan_sync(code), tmp_path / "synced")
    assert not any((Path(job_dir(n)) / "local.secret").exists() for n in inventory.nodes)

    # `script`: sortie writes the torchrun line.
    job = Job(run_id="mine", procs_per_node=2, command=Command(
        script="train.py", script_args=("--epochs", "3"), env={"MODE": "fast", "HOLD_S": "4"}))
    codes, _ = run_job(inventory, conns, job, {"MY_TOKEN": SECRET})
    assert codes == {"node-0": 0, "node-1": 0}
    seen = ranks(inventory, "mine")
    assert sorted(seen) == [0, 1, 2, 3] and {s["sum"] for s in seen.values()} == {6.0}
    for rank, facts in seen.items():
        node_rank = int(facts["SORTIE_NODE_RANK"])
        assert facts["node"] == f"node-{node_rank}" and facts["NODE_RANK"] == str(node_rank)
        assert facts["world"] == 4 and facts["SORTIE_NUM_NODES"] == "2"
        assert facts["SORTIE_PROCS_PER_NODE"] == "2" and facts["SORTIE_RUN_ID"] == "mine"
        assert facts["SORTIE_NODE_IPS"].split("\n") == [n.private_address
                                                        for n in inventory.nodes]
        assert facts["SORTIE_MASTER_ADDR"] == facts["MASTER_ADDR"] == \
            inventory.head.private_address
        assert facts["SORTIE_WORKDIR"] == job_dir(inventory.node(facts["node"]))
        assert facts["args"] == ["--epochs", "3"] and facts["mode"] == "fast"
        assert facts["token_ok"], f"rank {rank} did not get the secret"
    secret_files = [p for n in inventory.nodes for p in Path(n.workdir).rglob("*secrets*")]
    assert secret_files == [], "the secrets file is deleted once read"

    # `run`: the user writes the torchrun line from the contract.
    run = ("$SORTIE_PYTHON -m torch.distributed.run --nnodes=$SORTIE_NUM_NODES "
           "--nproc-per-node=$SORTIE_PROCS_PER_NODE --node-rank=$SORTIE_NODE_RANK "
           "--master-addr=$MASTER_ADDR --master-port=$MASTER_PORT train.py | cat")
    codes, _ = run_job(inventory, conns, Job(run_id="theirs", procs_per_node=2, command=Command(
                                                 run=run, env={"HOLD_S": "3"})),
                       {"MY_TOKEN": SECRET})
    assert codes == {"node-0": 0, "node-1": 0}
    seen = ranks(inventory, "theirs")
    assert sorted(seen) == [0, 1, 2, 3] and all(s["token_ok"] for s in seen.values())
    # Ranks 0-1 on the node with SORTIE_NODE_RANK 0: the user's --node-rank took effect.
    assert {s["node"] for r, s in seen.items() if r < 2} == {"node-0"}


def test_a_failing_stage_of_a_pipe_fails_the_run(tmp_path: Path, cluster):
    inventory, conns = cluster
    job = Job(run_id="pipe", procs_per_node=1, command=Command(run="false | cat"))
    train.launch_all(conns, inventory, job)
    watched = train.watch_all(conns, inventory, "pipe", lambda node, line: None)
    codes = watched.codes
    assert codes == {"node-0": 1, "node-1": 1}
    assert watched.first_failed in codes and watched.stopped == []


def test_what_a_job_left_running_in_its_session_ends_with_it_and_is_said(cluster):
    """Before: a `run:` line's `cmd &` (a server, a watcher, a stray loader) outlived the job on
    a held cluster until `sortie down`, holding the next exec's GPU memory and ports. Now it
    ends with the job (SIGTERM; SIGKILL where it ignores that), said in the job's log; the
    job's exit code is its command's."""
    inventory, conns = cluster
    marker = f"{time.time_ns() % 10**9}"  # this test's processes, by their argument
    # (The second ignores SIGTERM: a subshell's last command is exec'd, keeping the trap.)
    job = Job(run_id="leftover", procs_per_node=1, command=Command(
        run=f"sleep 1{marker} & (trap '' TERM; sleep 2{marker}) & echo started; exit 3"))
    train.launch_all(conns, inventory, job)
    lines: list[str] = []
    watched = train.watch_all(conns, inventory, "leftover",
                              lambda node, line: lines.append(f"{node} {line}"))
    assert watched.codes == {"node-0": 3, "node-1": 3}
    for node in ("node-0", "node-1"):
        assert f"{node} [sortie] the job left 2 processes running (sleep): ended" in lines, \
            lines
    left = subprocess.run(["pgrep", "-f", f"sleep [12]{marker}"], capture_output=True, text=True)
    assert left.stdout == "", "still running after the job: " + left.stdout


def test_a_halted_job_is_stopped_with_the_grace_its_halt_gives(cluster):
    """A hung job saves nothing: its ranks were given the 15 s a healthy job saves its
    checkpoint in (STOP_GRACE_S), 10 s of every hang's recovery spent on nothing."""
    inventory, conns = cluster
    stubborn = "trap '' TERM; while :; do sleep 0.1; done"  # ignores SIGTERM, as a hung rank
    job = Job(run_id="stuck", procs_per_node=1, command=Command(run=stubborn))
    train.launch_all(conns, inventory, job)
    asked: list[float] = []

    def halt() -> tuple[str, float] | None:
        asked.append(time.monotonic())
        return ("hung: a test", 0.5) if len(asked) > 5 else None  # after a second of watching

    watched = train.watch_all(conns, inventory, "stuck", lambda node, line: None, halt=halt)
    stopped_in = time.monotonic() - asked[-1]
    assert watched.halted == "hung: a test" and sorted(watched.stopped) == ["node-0", "node-1"]
    # killed after its half second, not after the 15 s of a job that can still save
    assert stopped_in < train.STOP_GRACE_S - 5, stopped_in


def test_setup_runs_once_per_fingerprint_and_failures_name_the_node(tmp_path: Path, cluster):
    inventory, conns = cluster
    code = project(tmp_path / "project")
    sync(inventory, plan_sync(code), tmp_path / "synced")
    job = Job(run_id="s", procs_per_node=1,
              command=Command(script="train.py", env={"MODE": "x"}))
    setup = ("echo ran >> $SORTIE_WORKDIR/../setup-runs; test \"$MY_TOKEN\" = " + SECRET
             # In the job's own environment (local nodes' Python is sortie's), never sortie's.
             + "; test \"$VIRTUAL_ENV/bin/python\" = \"$SORTIE_PYTHON\"; test "
             "\"$(command -v python)\" = \"$SORTIE_PYTHON\"; test \"$VIRTUAL_ENV\" != "
             + shlex.quote(sys.prefix) + "; mkdir -p .venv")

    def fingerprint() -> str:
        return setup_fingerprint(setup, {"MODE": "x"}, plan_sync(code), ("requirements.txt",))

    def runs() -> list[int]:
        return [len((Path(n.workdir) / "setup-runs").read_text().split())
                for n in inventory.nodes]

    secrets = {"MY_TOKEN": SECRET}
    assert setup_all(conns, inventory, job, setup, fingerprint(), secrets) == \
        {"node-0": True, "node-1": True}
    assert setup_all(conns, inventory, job, setup, fingerprint(), secrets) == \
        {"node-0": False, "node-1": False}, "cached"
    assert runs() == [1, 1]
    (code / "requirements.txt").write_text("numpy\ntorch\n")
    assert setup_all(conns, inventory, job, setup, fingerprint(), secrets) == \
        {"node-0": True, "node-1": True}, "an input changed"
    assert setup_all(conns, inventory, job, setup, fingerprint(), secrets, rerun=True) == \
        {"node-0": True, "node-1": True}, "--rerun-setup"
    assert runs() == [3, 3]

    failing = "echo installing; echo 'ERROR: no matching distribution' >&2; exit 3"
    with pytest.raises(SortieError) as error:
        setup_all(conns, inventory, job, failing, "f" * 64, {})
    message = str(error.value)
    # Either node's may come first (the first stops the other), under load node-1's.
    assert re.match(r"node-[01]: setup failed \(exit 3\)", message) and \
        "ERROR: no matching distribution" in message, message
    named = inventory.node(message.split(":")[0])
    assert not (Path(node_layout.node_dir(named)) / "setup.done").exists(), \
        "a failed setup leaves no marker: the next one runs"


def test_a_setups_output_is_streamed_from_every_node_as_it_runs(
        tmp_path: Path, cluster, monkeypatch: pytest.MonkeyPatch):
    """Before, a long `pip install` was minutes of a spinner: its output came only in the log,
    after. Each node's lines now come as they are written, whole, in order, also when more
    comes at once than one read takes (FOLLOW_CHUNK, small here), and a line the setup ends
    without its newline."""
    from sortie.bootstrap import follow

    inventory, conns = cluster
    sync(inventory, plan_sync(project(tmp_path / "project")), tmp_path / "synced")
    monkeypatch.setattr(follow, "FOLLOW_CHUNK", 4096)
    job = Job(run_id="streamed", procs_per_node=1, command=Command(script="train.py"))
    released = tmp_path / "released"
    # The first line, then a wait until the test has seen it (streamed, not read at the end);
    # then 20,000 numbered lines at once and a last line without its newline.
    setup = (f"echo first on $SORTIE_NODE_RANK; for i in $(seq 300); do test -e "
             f"{shlex.quote(str(released))} && break; sleep 0.1; done\n"
             f"test -e {shlex.quote(str(released))} && echo released || echo 'not seen in 30 s'\n"
             "seq 1 20000; printf 'last, no newline'")
    lines: dict[str, list[str]] = {"node-0": [], "node-1": []}

    def on_line(node: str, line: str) -> None:
        lines[node].append(line)
        if all(seen[:1] for seen in lines.values()):
            released.touch()

    ran = setup_all(conns, inventory, job, setup, "a" * 64, {}, on_line=on_line)
    assert ran == {"node-0": True, "node-1": True}
    for rank, node in enumerate(("node-0", "node-1")):
        assert lines[node] == [f"first on {rank}", "released", *map(str, range(1, 20001)),
                               "last, no newline"], lines[node][:3]
