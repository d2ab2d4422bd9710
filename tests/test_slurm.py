"""Sorties on a real Slurm: Debian's munged, slurmctld and slurmd (`stacks/slurm/slurm_lab.py`), the
daemons in network namespaces of their own, sortie on the login node. Needs root and
`apt-get install slurm-wlm munge` (`make test` installs them)."""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from sortie.infra.keys import fingerprint
from sortie.stacks.slurm.slurm_lab import LabUser, SlurmLab, lab_user, missing_tools
from tests.helpers import child_env, wait_until

MISSING = missing_tools()
pytestmark = [pytest.mark.e2e, pytest.mark.skipif(
    bool(MISSING), reason=f"a real Slurm needs {', '.join(MISSING)} (apt-get install slurm-wlm "
    "munge, as root)")]


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> SlurmLab:
    """Three compute nodes; partition `debug` (the default: its jobs get 15 s to stop when
    preempted), `lab` (account `physics` only), `urgent` (preempts the others) and `short`
    (a minute at most)."""
    slurm = SlurmLab(tmp_path_factory.mktemp("slurm-lab"), nodes=3,
                     partitions={"debug": "Default=YES PriorityTier=1 GraceTime=15",
                                 "lab": "AllowAccounts=physics PriorityTier=1",
                                 "urgent": "PriorityTier=10", "short": "MaxTime=1"})
    try:  # a start that fails half-way leaves nothing either (namespaces, daemons)
        slurm.start()
        yield slurm
    finally:
        slurm.stop()


class Login:
    """A user's shell on the login node: an ordinary account's (`lab_user`, as sites run jobs:
    never root), their own SORTIE_HOME, the shared directory sorties work in, the cluster
    attached as `lab`. What the test writes there as root becomes the user's before each
    command, as if they had written it."""

    def __init__(self, lab: SlurmLab, user: LabUser | None, under: Path | None = None) -> None:
        """``user`` None: root's shell, its directory in ``under`` (else a temporary one)."""
        self.lab, self.user = lab, user
        self.home = Path(tempfile.mkdtemp(prefix="login-", dir=user.home if user else under))
        self.shared = self.home / "shared"
        self.shared.mkdir(parents=True)
        self.runs = self.home / "runs"
        self.python = Path(sys.executable)  # the nodes' (`lab_view`: the user sees it too)

    def _argv(self, args: tuple[str, ...]) -> list[str]:
        return [*self.lab.login_prefix(), *(self.user.runs() if self.user else ()),
                sys.executable, "-m", "sortie", *args]

    def _env(self) -> dict[str, str]:
        return child_env({**self.lab.environment(),
                          **(self.user.environment() if self.user else {}),
                          "SORTIE_HOME": str(self.home / "sortie-home")})

    def _own(self) -> None:
        """What root made in the user's directory (the test's files) is the user's."""
        if self.user is None:
            return
        # (os.walk: a directory gone mid-walk is skipped, where rglob would raise)
        found = [Path(top) / name for top, dirs, files in os.walk(self.home)
                 for name in (*dirs, *files)]
        for path in (self.home, *found):
            # A file the user's running sortie renames meanwhile (an atomic write's temporary
            # file: seen in CI) is gone by the time it is looked at: it is the user's anyway.
            with contextlib.suppress(FileNotFoundError):
                if path.lstat().st_uid == 0:
                    os.chown(path, self.user.uid, self.user.gid, follow_symlinks=False)

    def sortie(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        self._own()
        return subprocess.run(self._argv(args), env=self._env(), cwd=self.home,
                              capture_output=True, text=True, timeout=timeout)

    def start(self, *args: str) -> subprocess.Popen[str]:
        self._own()
        return subprocess.Popen(self._argv(args), env=self._env(), cwd=self.home,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def remove(self) -> None:
        shutil.rmtree(self.home, ignore_errors=True)

    def hello_task(self) -> str:
        """A task whose every node says its rank and host, after a setup of its own (each
        node's, once: cached after)."""
        (self.home / "job").mkdir(exist_ok=True)
        (self.home / "job" / "hello.sh").write_text(
            'echo "rank $SORTIE_NODE_RANK of $SORTIE_NUM_NODES on $(hostname)"\n'
            'if [ "$SORTIE_NODE_RANK" = 0 ]; then echo "rank 0 was here" > hello.txt; fi\n')
        (self.home / "hello.yaml").write_text(
            "workdir: job\nsetup: hostname >> setups.txt\nrun: bash hello.sh\n")
        return "hello.yaml"

    def state(self, name: str) -> str:
        """Sortie ``name``'s state as `sortie status --json` says it."""
        rows = json.loads(self.sortie("status", "--json").stdout)["sorties"]
        return next(row["state"] for row in rows if row["name"] == name)

    def queue(self) -> list[str]:
        """The jobs Slurm still has of this user's sorties: `name state`."""
        shown = self.lab.login("squeue", "-h", "-o", "%j %T").stdout.split("\n")
        return [line for line in shown if line.startswith("sortie-")]


class Elsewhere(Login):
    """A user whose controller is not on the login node: no Slurm configuration, no way to the
    cluster's network here; sortie reaches the login node over SSH."""

    def _argv(self, args: tuple[str, ...]) -> list[str]:
        return [sys.executable, "-m", "sortie", *args]

    def _env(self) -> dict[str, str]:
        return child_env({"SORTIE_HOME": str(self.home / "sortie-home")})


def runs_as_lab_user(lab: SlurmLab, user: LabUser) -> LabUser | None:
    """``user`` where it can run this checkout's sortie (its Python, its files), else None:
    root runs the jobs then, said as a warning (a checkout only root can read)."""
    tried = subprocess.run([*lab.login_prefix(), *user.runs(), "sh", "-c",
                            '"$0" -c "import sortie"', sys.executable],
                           capture_output=True, text=True, timeout=60, cwd="/")
    if tried.returncode == 0:
        return user
    warnings.warn(f"the Slurm lab's jobs run as root: {user.name} cannot run {sys.executable} "
                  f"with this checkout ({tried.stderr.strip()[-200:]})", stacklevel=2)
    return None


@pytest.fixture
def login(lab: SlurmLab) -> Login:
    user = Login(lab, runs_as_lab_user(lab, lab_user()))
    try:
        attached = user.sortie("attach", "lab", "--slurm", "--shared-dir", str(user.shared),
                               "--python", str(user.python))
        assert attached.returncode == 0, attached.stderr
        yield user
        for row in json.loads(user.sortie("status", "--json").stdout or "{}").get("sorties", []):
            user.sortie("down", row["name"])
    finally:
        user.remove()


def test_a_whole_sortie_runs_in_one_allocation_and_leaves_nothing_queued(login: Login) -> None:
    started = time.time()
    done = login.sortie("run", "--slurm", "lab", "--nodes", "2", "--steps", "30",
                        "--runs-dir", str(login.runs), "--name", "whole", "--json")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert result["summary"]["world_size"] == 4 and result["summary"]["steps"] == 30
    assert result["teardown"]["clean"] and result["teardown"]["removed"] == 1
    # Slurm's accounting (slurmdbd, `sacct`) says how long the allocation held its nodes: the
    # cost line counts that, not the time it queued.
    held_s = result["teardown"]["accounted_s"]
    assert 0 < held_s <= time.time() - started
    ledger = json.loads(next((login.home / "sortie-home" / "costs").glob("whole-*.json")
                             ).read_text())
    assert ledger["accounted_s"] == held_s
    assert "srun job steps (no SSH)" in done.stderr
    assert "no $ per GPU-hour for partition default of lab: counted at $0" in done.stderr
    # Rank 0 on the first node Slurm gave, the rendezvous at its NodeAddr on the nodes' link.
    log = (login.runs / "whole" / "logs" / "node-0.log").read_text()
    assert "world_size=4" in log
    assert login.queue() == []
    assert not (login.shared / "sortie-whole").exists()  # its workdir on the shared disk


@pytest.mark.parametrize(("flags", "field", "slurm_says"), [
    (("--partition", "nope"), "--partition", "Slurm refused the allocation: invalid partition"),
    (("--nodes", "9"), "--nodes", "9 asked, partition debug has 3 in all"),
    # (An account without a Slurm association, as the lab's users are: "not known"; root's
    # "not permitted".)
    (("--partition", "lab", "--account", "chemistry"), "--account",
     "Slurm refused the allocation: Job's account not known, so it can't use this partition "
     "(lab allows physics"),
])
def test_what_slurm_refuses_is_one_line_and_nothing_is_left_queued(
        login: Login, flags: tuple[str, ...], field: str, slurm_says: str) -> None:
    done = login.sortie("run", "--slurm", "lab", *flags)
    assert done.returncode == 2, done.stderr
    line = done.stderr.strip()
    assert "\n" not in line and "Traceback" not in line
    assert line.startswith(f"sortie: error: {field}: {slurm_says}"), line
    assert login.queue() == []
    assert not list(login.shared.iterdir())
    # (issue 67: a refusal was a 0 s run in the cost ledger)
    assert not list((login.home / "sortie-home" / "costs").glob("*.json"))


def test_an_unknown_slurm_cluster_is_named_and_a_known_one_attached_again(login: Login) -> None:
    done = login.sortie("run", "--slurm", "elsewhere")
    assert done.returncode == 2
    assert "--slurm: no Slurm cluster named 'elsewhere'" in done.stderr
    again = login.sortie("attach", "lab", "--slurm", "--shared-dir", str(login.shared),
                         "--python", str(login.python), "--usd-per-gpu-hour", "debug=3")
    assert again.returncode == 0, again.stderr
    site = json.loads((login.home / "sortie-home" / "slurm" / "lab" / "site.json").read_text())
    assert site["usd_per_gpu_hour"] == {"debug": 3.0}
    missing = login.sortie("attach", "lab2", "--slurm", "--shared-dir", str(login.home / "no"))
    assert missing.returncode == 2 and "--shared-dir:" in missing.stderr
    no_python = login.sortie("attach", "lab2", "--slurm", "--python", "/nowhere/bin/python")
    assert no_python.returncode == 2 and "--python: '/nowhere/bin/python' not found here" in \
        no_python.stderr, no_python.stderr  # (issue 67: the run failed later, exit 127)


def test_an_attached_slurm_cluster_is_listed_and_detached_untouched(login: Login) -> None:
    """Issue 66: an attached Slurm cluster was not in `status`, and `down NAME` (or `--forget`)
    said "no sortie named". Listed now; `down NAME` forgets its record, nothing on the cluster
    touched; `down --all` leaves it (named one by one, like a kept bucket)."""
    for forget in ((), ("--forget",)):
        attached = login.sortie("attach", "lab3", "--slurm", "--shared-dir", str(login.shared))
        assert attached.returncode == 0, attached.stderr
        [row] = [r for r in json.loads(login.sortie("status", "--json").stdout)["sorties"]
                 if r["name"] == "lab3"]
        assert (row["backend"], row["state"], row["nodes"]) == ("slurm", "attached", 0), row
        shown = " ".join(login.sortie("status").stdout.split())
        assert "lab3: Slurm cluster to allocate on (`sortie run --slurm lab3`)" in shown, shown
        every = login.sortie("down", "--all", "--yes")
        assert every.returncode == 0, every.stderr
        assert (login.home / "sortie-home" / "slurm" / "lab3" / "site.json").is_file()
        down = login.sortie("down", "lab3", *forget)
        assert down.returncode == 0, down.stderr
        assert "lab3: detached: its record is forgotten; nothing on the Slurm cluster was " \
            "touched" in " ".join(down.stdout.split()), down.stdout
        rows = json.loads(login.sortie("status", "--json").stdout)["sorties"]
        assert "lab3" not in [row["name"] for row in rows]
    assert login.queue() == [] and not list(login.shared.iterdir()), "nothing on it touched"
    # One name space: an attached Slurm cluster's name is no other sortie's.
    taken = login.sortie("attach", "lab", "--hosts", str(login.home / "none.yaml"))
    assert taken.returncode == 2 and "NAME: a sortie named 'lab' exists" in taken.stderr


def test_a_shared_directory_another_user_made_first_is_refused(login: Login) -> None:
    """Fourth review (issue 61): `mkdir -m 700 -p` took a `sortie-NAME/` another user had made
    first in a shared directory (mode 1777 scratch), with a trainer of theirs seeded in it: every
    node then ran it as the victim. Refused in one line now, before anything is queued."""
    planted = login.shared / "sortie-adopt"
    (planted / "trainers").mkdir(parents=True)
    os.chown(planted, 65534, 65534)  # nobody's
    planted.chmod(0o777)
    held = login.sortie("up", "--slurm", "lab", "--nodes", "1", "--name", "adopt")
    assert held.returncode == 2, held.stderr
    assert held.stderr.strip() == (
        f"sortie: error: --shared-dir: {planted} exists and is not this user's own directory of "
        "mode 700 (owner uid 65534, mode 777): sortie works only in one it made (another user "
        "could have put what it runs there); remove it, or choose another name")
    assert not [job for job in login.queue() if job.startswith("sortie-adopt ")]
    assert sorted(p.name for p in planted.iterdir()) == ["trainers"], "nothing written there"
    planted.chmod(0o700)  # this user's own, made before (a name held again): taken
    os.chown(planted, *((login.user.uid, login.user.gid) if login.user else (0, 0)))
    held = login.sortie("up", "--slurm", "lab", "--nodes", "1", "--name", "adopt")
    assert held.returncode == 0, held.stderr
    assert login.sortie("down", "adopt").returncode == 0


def test_a_held_allocation_runs_jobs_until_down(login: Login) -> None:
    held = login.sortie("up", "--slurm", "lab", "--nodes", "2", "--name", "held")
    assert held.returncode == 0, held.stderr
    status = json.loads(login.sortie("status", "--json").stdout)
    row = next(r for r in status["sorties"] if r["name"] == "held")
    assert (row["backend"], row["state"], row["nodes"]) == ("slurm", "up", 2)
    task = login.hello_task()
    # Issue 66 (1): the queue on an allocation: a second exec waits for the first, detached;
    # the running one cancelled, the next runs; the allocation stays.
    (login.home / "long.yaml").write_text("workdir: job\nrun: sleep 300\n")
    first = login.sortie("exec", "held", "long.yaml", "-d", "--name", "first", "--runs-dir",
                         str(login.runs))
    assert first.stdout.startswith("first: running on held, detached"), first.stdout + \
        first.stderr
    second = login.sortie("exec", "held", task, "-d", "--name", "second", "--runs-dir",
                          str(login.runs))
    assert second.stdout.startswith("second: queued on held"), second.stdout + second.stderr
    stopped = login.sortie("cancel", "held")
    assert stopped.stdout.strip() == "first: interrupted; held is still up (`sortie down held` " \
        "ends it)", stopped.stdout + stopped.stderr
    deadline = time.monotonic() + 120
    while (jobs := {job["id"]: job["state"] for job in json.loads(
            login.sortie("jobs", "held", "--json").stdout)}).get("second") != "succeeded":
        assert time.monotonic() < deadline and jobs.get("second") in ("queued", "running"), jobs
        time.sleep(0.5)
    for _ in range(2):  # the allocation stays between jobs
        ran = login.sortie("exec", "held", task, "--runs-dir", str(login.runs))
        assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-2000:]
    said = ran.stdout + ran.stderr
    assert "setup cached on node-0, node-1" in " ".join(said.split()), said[-2000:]
    # One setup per node (the shared disk's one workdir, each node's own marker), not again.
    setups = (login.shared / "sortie-held" / "job" / "setups.txt").read_text().split()
    assert len(setups) == 2 and set(setups) <= {"n1", "n2", "n3"}, setups
    # The file rank 0 wrote in the one shared workdir is collected once (both nodes list it;
    # each sees the other's own directory there): not again as node-1's.
    latest = max(login.runs.glob("*/manifest.json"), key=lambda p: p.stat().st_mtime)
    written = [f["path"] for f in json.loads(latest.read_text())["files"]
               if f["path"].endswith("hello.txt")]
    assert written == ["artifacts/hello.txt"], written
    hosts = {line.split()[-1] for line in said.splitlines() if " of 2 on " in line}
    assert len(hosts) == 2 and hosts <= {"n1", "n2", "n3"}, said
    assert [q.split()[0] for q in login.queue()] == ["sortie-held"]
    inside = login.sortie("ssh", "held", "node-1", "--", "hostname", "&&", "pwd")
    assert inside.returncode == 0, inside.stderr
    host, where = inside.stdout.split()
    assert host in hosts and where == str(login.shared / "sortie-held" / "job")
    logs = login.sortie("logs", "held")
    assert logs.returncode == 0 and " of 2 on " in logs.stdout, logs.stderr
    # What a job left running in its step ends with it (proctrack/linuxproc lets an orphan
    # outlive its step, as it did here until `down`), said in its log.
    marker = f"{time.time_ns() % 10**9}"
    (login.home / "leaves.yaml").write_text(f"workdir: job\nrun: sleep 1{marker} & echo left\n")
    leaves = login.sortie("exec", "held", "leaves.yaml", "--runs-dir", str(login.runs))
    ended = " ".join((leaves.stdout + leaves.stderr).split())
    assert leaves.returncode == 0, ended[-2000:]
    assert ended.count("[sortie] the job left 1 process running (sleep): ended") == 2, ended
    assert subprocess.run(["pgrep", "-f", f"sleep 1{marker}"]).returncode == 1
    # Issue 66 (4): requeued by Slurm (its nodes lost whole), `repair` gets a new allocation.
    record = login.home / "sortie-home" / "allocations" / "held" / "allocation.json"
    requeued = json.loads(record.read_text())["job_id"]
    login.lab.login("scontrol", "requeue", requeued)
    wait_until(lambda: login.state("held") == "queued", 60, "Slurm never requeued it")
    mended = login.sortie("repair", "held")
    assert mended.returncode == 0, mended.stdout + mended.stderr
    assert f"held: replaced node-0, node-1 (allocation {requeued} requeued by Slurm" in \
        " ".join(mended.stdout.split()), mended.stdout
    assert json.loads(record.read_text())["job_id"] != requeued
    again = login.sortie("exec", "held", task, "--runs-dir", str(login.runs))
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    check = login.sortie("check", "held", "--json")
    assert check.returncode == 0, check.stderr
    # Issue 66: the cluster it is on is listed, and stays while an allocation needs it.
    site = next(r for r in json.loads(login.sortie("status", "--json").stdout)["sorties"]
                if r["name"] == "lab")
    assert (site["backend"], site["state"]) == ("slurm", "attached"), site
    assert site["detail"].endswith("allocations on it: held"), site
    in_use = login.sortie("down", "lab")
    assert in_use.returncode == 1 and "`sortie down held` first" in in_use.stderr, in_use.stderr
    down = login.sortie("down", "held")
    assert down.returncode == 0, down.stderr
    assert "by Slurm's accounting (sacct)" in " ".join(down.stdout.split())
    assert login.queue() == []
    ledger = json.loads(next((login.home / "sortie-home" / "costs").glob("held-*.json")
                             ).read_text())
    assert ledger["kind"] == "held" and ledger["accounted_s"] > 0


def test_an_allocation_requeued_and_running_again_is_lost_whole(login: Login) -> None:
    """Slurm requeued the allocation and ran it again before sortie asked (a preempting job of
    seconds): the steps died with it, the job id is the same and RUNNING. Its Restarts count
    says it: every node is lost, "requeued by Slurm" (CI read it as "srun step failed")."""
    held = login.sortie("up", "--slurm", "lab", "--nodes", "1", "--name", "again")
    assert held.returncode == 0, held.stderr
    job = login.lab.login("squeue", "-h", "-n", "sortie-again", "-o", "%i").stdout.strip()
    ask = ("from pathlib import Path; from sortie.stacks.slurm.slurm_backend import SlurmBackend; "
           "b = SlurmBackend(Path('sortie-home')); i = b.inventory('again'); "
           "lost = b.lost_nodes(i); print(lost.nodes, lost.why)")
    asked = [*login.lab.login_prefix(), sys.executable, "-c", ask]
    env = child_env({**login.lab.environment(), "SORTIE_HOME": str(login.home / "sortie-home")})
    before = subprocess.run(asked, env=env, cwd=login.home, capture_output=True, text=True)
    assert before.stdout.startswith("[] "), before.stdout + before.stderr
    login.lab.login("scontrol", "requeue", job)
    deadline, shown = time.monotonic() + 120, ""
    while time.monotonic() < deadline and not re.search(r"JobState=RUNNING .*Restarts=1 ", shown):
        if "Reason=BeginTime" in shown:  # Slurm holds a requeued job back a while: not here
            login.lab.login("scontrol", "update", f"JobId={job}", "StartTime=now")
        time.sleep(0.5)
        shown = login.lab.login("scontrol", "show", "job", "-o", job).stdout
    after = subprocess.run(asked, env=env, cwd=login.home, capture_output=True, text=True)
    assert after.stdout.startswith(f"['node-0'] allocation {job} requeued by Slurm"), (
        after.stdout + after.stderr)


def test_an_allocation_cancelled_from_outside_is_said_collected_and_gone(login: Login) -> None:
    run = login.start("run", "--slurm", "lab", "--nodes", "2", "--steps", "100000",
                      "--runs-dir", str(login.runs), "--name", "cut")
    seen: list[str] = []
    deadline = time.monotonic() + 240
    assert run.stdout is not None
    for line in run.stdout:
        seen.append(line)
        if "step " in line and "loss" in line or time.monotonic() > deadline:
            break
    job = login.lab.login("squeue", "-h", "-n", "sortie-cut", "-o", "%i").stdout.strip()
    assert job.isdigit(), "".join(seen)
    login.lab.login("scancel", job)
    out, _ = run.communicate(timeout=240)
    output = "".join(seen) + out
    assert run.returncode == 1, output
    assert f"allocation {job} was cancelled outside sortie" in output
    assert (login.runs / "cut" / "logs" / "node-0.log").is_file(), output[-3000:]
    assert login.queue() == []


def assert_saved_where_the_signal_found_it(run_dir: Path, lost_at: int, resumed_from: int) -> None:
    """No periodic checkpoint falls in these runs, so the one the trainer's metrics record is
    the one it saved on Slurm's signal, and the job resumed from exactly it. The controller's
    last logged step (every 10) can lag it under load, so that only bounds it from below."""
    records = [json.loads(line) for line in
               (run_dir / "artifacts" / "metrics.jsonl").read_text().splitlines()]
    saved = [r["step"] for r in records if r.get("checkpoint")]
    assert 0 < lost_at <= resumed_from and saved[:1] == [resumed_from], (lost_at, saved)


def follow(run: subprocess.Popen[str], seen: list[str], until: str, timeout: float) -> bool:
    """Read the controller's output until it says ``until`` (a regular expression, matched
    across the lines a long one was wrapped into) (True) or it ends."""
    deadline = time.monotonic() + timeout
    assert run.stdout is not None
    for line in run.stdout:
        seen.append(line)
        if re.search(until, " ".join("".join(seen[-8:]).split())):
            return True
        if time.monotonic() > deadline:
            break
    return False


@pytest.mark.timeout(600)
def test_a_time_limit_checkpoints_and_a_new_allocation_resumes_exactly(login: Login) -> None:
    """Slurm signals the job 30 s before its 3-minute limit (up to 60 s sooner): the trainer
    saves the step it is at and stops, sortie asks Slurm for a new allocation and the job
    resumes from that very step (no checkpoint but the signal's: --ckpt-every is past the end).
    (Three minutes: with two, a CI run's new allocation was signalled in its turn before the
    relaunch, on a loaded machine, had said where it resumed.)"""
    run = login.start("run", "--slurm", "lab", "--nodes", "2", "-p", "1", "--time", "3",
                      "--steps", "1000000", "--ckpt-every", "1000000", "--runs-dir",
                      str(login.runs), "--name", "limit", "--", "--log-every", "10",
                      # Paced: the minute or two until the signal costs no CPU the suite's
                      # other tests need (flat out, it took 1.6 of the 2 cores for 100 s; at
                      # 0.05 s a step, 54 CPU-seconds).
                      "--min-step-s", "0.25")
    seen: list[str] = []
    resumed = follow(run, seen, r"recovery 1: .*resumed from step \d+", 360)
    output = " ".join("".join(seen).split())
    assert resumed, output[-3000:]
    found = re.search(r"recovery 1: replaced node-0, node-1 \(time limit: \d+s left, Slurm "
                      r"signalled the job\); lost at step (\d+), resumed from step (\d+)", output)
    assert found, output[-3000:]
    lost_at, resumed_from = int(found.group(1)), int(found.group(2))
    now = login.lab.login("squeue", "-h", "-n", "sortie-limit", "-o", "%i %T").stdout.split()
    record = json.loads((login.home / "sortie-home" / "allocations" / "limit" /
                         "allocation.json").read_text())
    assert now == [record["job_id"], "RUNNING"] and len(record["earlier"]) == 1
    assert record["earlier"][0] != record["job_id"]
    run.send_signal(signal.SIGINT)  # then the user stops it: torn down, nothing left
    out, _ = run.communicate(timeout=120)
    assert run.returncode == 130, out[-2000:]
    assert_saved_where_the_signal_found_it(login.runs / "limit", lost_at, resumed_from)
    assert login.queue() == []


@pytest.mark.timeout(600)
def test_a_node_lost_in_the_allocation_gets_a_new_one_without_it(login: Login) -> None:
    """A compute node dies (its slurmd and everything on it killed): the other's collectives
    fail, sortie finds the dead node (no step runs there), asks Slurm for a new allocation
    that excludes it, and the job resumes from its last checkpoint to the end."""
    run = login.start("run", "--slurm", "lab", "--nodes", "2", "-p", "1", "--steps", "300",
                      "--ckpt-every", "20", "--runs-dir", str(login.runs), "--name", "lost",
                      "--", "--log-every", "10")
    seen: list[str] = []
    assert follow(run, seen, r"step 40/300", 240), "".join(seen)[-3000:]
    inventory = json.loads((login.home / "sortie-home" / "allocations" / "lost" /
                            "inventory.json").read_text())
    dead = inventory["nodes"][1]["srun"]["host"]
    index = int(dead.removeprefix("n"))
    try:
        login.lab.stop_node(index)
        out, _ = run.communicate(timeout=400)
    finally:
        login.lab.start_node(index)
        login.lab.wait_idle()
    output = " ".join(("".join(seen) + out).split())
    assert run.returncode == 0, output[-4000:]
    # Slurm saw the node die (the job requeued) or sortie did first (no step runs there).
    found = re.search(r"recovery 1: replaced (node-0, )?node-1 \((allocation \d+ requeued by "
                      r"Slurm[^;]*|srun step failed)\); lost at step (\d+), resumed from step "
                      r"(\d+)", output)
    assert found, output[-3000:]
    lost_at, resumed_from = int(found.group(3)), int(found.group(4))
    assert resumed_from % 20 == 0 and lost_at - 20 <= resumed_from <= lost_at
    summary = json.loads((login.runs / "lost" / "artifacts" / "summary.json").read_text())
    assert summary["steps"] == 300
    assert login.queue() == []


def test_two_users_sorties_of_one_name_share_the_cluster_and_end_apart(
        login: Login, tmp_path: Path) -> None:
    """Two users (two accounts, each with a controller of its own) hold allocations of the
    same sortie name: each `down` cancels only the job it submitted, and a job runs on the
    other meanwhile."""
    other = Login(login.lab, login.user and runs_as_lab_user(login.lab, lab_user("sortie-lab2")))
    try:
        assert other.sortie("attach", "lab", "--slurm", "--shared-dir", str(other.shared),
                            "--python", str(other.python)).returncode == 0
        for user in (login, other):
            held = user.sortie("up", "--slurm", "lab", "--nodes", "2", "--name", "dev")
            assert held.returncode == 0, held.stderr
        owners = login.lab.login("squeue", "-h", "-o", "%j %.30u").stdout.split("\n")
        assert sorted(o.split()[1] for o in owners if o.startswith("sortie-dev ")) == (
            ["sortie-lab", "sortie-lab2"] if login.user else ["root", "root"])
        assert login.sortie("down", "dev").returncode == 0
        assert [q.split() for q in other.queue()] == [["sortie-dev", "RUNNING"]]
        ran = other.sortie("exec", "dev", other.hello_task(), "--runs-dir", str(other.runs))
        assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-2000:]
        assert other.sortie("down", "dev").returncode == 0
        assert login.queue() == []
    finally:
        other.sortie("down", "dev")
        other.remove()


@pytest.mark.timeout(600)
def test_two_sorties_slurm_puts_on_the_same_nodes_both_train(login: Login) -> None:
    """Issue 67 (2): an allocation does not take whole nodes, so Slurm packs two sorties on the
    same nodes; both rendezvoused on 29400 and the second died (`Address already in use`).
    Each now has a port of its own, free on its nodes. (67 (1): each node's interface is named
    its own here, eth-n1, eth-n2, ...: gloo binds there, per node.)"""
    runs = {name: login.start("run", "--slurm", "lab", "--nodes", "2", "-p", "1", "--steps",
                              "40", "--runs-dir", str(login.runs), "--name", name)
            for name in ("one", "two")}
    placed: dict[str, tuple[set[str], int]] = {}
    deadline = time.monotonic() + 240
    while len(placed) < 2 and time.monotonic() < deadline:
        for name in runs:
            path = login.home / "sortie-home" / "allocations" / name / "inventory.json"
            if name not in placed and path.is_file():
                inventory = json.loads(path.read_text())
                placed[name] = ({n["srun"]["host"] for n in inventory["nodes"]},
                                inventory["rdzv_port"])
                assert [n["interface"] for n in inventory["nodes"]] == \
                    [f"eth-{n['srun']['host']}" for n in inventory["nodes"]], inventory
        time.sleep(0.2)
    outs = {name: run.communicate(timeout=300)[0] for name, run in runs.items()}
    for name, run in runs.items():
        assert run.returncode == 0, " ".join(outs[name].split())[-3000:]
    (hosts_one, port_one), (hosts_two, port_two) = placed["one"], placed["two"]
    assert hosts_one & hosts_two and port_one != port_two, placed
    assert login.queue() == []


def test_a_queued_allocation_says_why_it_waits_and_gives_up_when_told(login: Login) -> None:
    """Issue 67 (4): 600 s in the queue and sortie gave up, saying a cloud's words, with a
    spinner meanwhile. It waits as long as the user allows (`--queue-timeout`; none by
    default), saying its job id, Slurm's reason and estimated start; given up, nothing is left
    queued."""
    blocker = login.lab.login("sbatch", "--parsable", "--exclusive", "-N", "3",
                              "--output=/dev/null", "--wrap", "sleep 300").stdout.strip()
    try:
        done = login.sortie("run", "--slurm", "lab", "--nodes", "2", "--queue-timeout", "15s",
                            "--name", "waits", "--runs-dir", str(login.runs))
    finally:
        login.lab.login("scancel", blocker)
    said = " ".join((done.stdout + done.stderr).split())
    assert done.returncode == 1, said[-2000:]
    assert re.search(r"allocation \d+ pending \((Resources|Priority)\)", said), said[-2000:]
    waited = re.search(r"still pending \((Resources|Priority)\) after (\d+)s in the queue "
                       r"\(--queue-timeout\)", said)
    # At its timeout or the poll after it (20 s on a machine at load 15: two clones' tests).
    assert waited and 15 <= int(waited.group(2)) <= 60, said[-2000:]
    assert "no launch attempt brought up" not in said, said[-2000:]
    wait_until(lambda: not login.queue(), 60, login.queue)  # (the blocker, cancelled, ending)


def test_what_is_unavailable_now_is_queued_and_past_maxtime_is_said_in_words(
        login: Login) -> None:
    """Issue 67 (5): `sbatch --test-only` refused what Slurm would queue (a drained node:
    "Requested node configuration is not available", naming no node), and a limit past a
    partition's MaxTime named --partition, quoting PartitionTimeLimit. Now what is only
    unavailable is queued, the nodes said; what can never run is refused in words."""
    login.lab.login("scontrol", "update", "nodename=n3", "state=drain", "reason=maintenance")
    try:
        waits = login.sortie("run", "--slurm", "lab", "--nodes", "3", "--queue-timeout", "5s",
                             "--name", "drained", "--runs-dir", str(login.runs))
    finally:
        login.lab.login("scontrol", "update", "nodename=n3", "state=resume")
    said = " ".join((waits.stdout + waits.stderr).split())
    assert waits.returncode == 1, said[-2000:]
    assert "1 of partition debug's 3 nodes unavailable now: n3 (drain: maintenance); queued " \
           "until enough are back" in said, said[-2000:]
    assert "in the queue (--queue-timeout)" in said, said[-2000:]
    too_many = login.sortie("run", "--slurm", "lab", "--nodes", "4")
    assert too_many.returncode == 2 and too_many.stderr.strip() == \
        "sortie: error: --nodes: 4 asked, partition debug has 3 in all", too_many.stderr
    past = login.sortie("run", "--slurm", "lab", "--partition", "short", "--time", "5",
                        "--name", "past", "--runs-dir", str(login.runs))
    assert past.returncode == 2 and past.stderr.strip().endswith(
        "--time: Slurm will not run the allocation: its time limit 00:05:00 is longer than "
        "partition short's MaxTime 00:01:00"), past.stderr
    assert login.queue() == []


def test_an_allocation_is_shaped_as_asked(login: Login) -> None:
    """Issue 67 (3): memory, CPUs, nodes to avoid, several partitions and a free-form sbatch
    option reach Slurm as asked (Slurm's own record of the job says so)."""
    held = login.sortie("up", "--slurm", "lab", "--nodes", "1", "--name", "shaped",
                        "--partition", "debug,short", "--mem", "100M", "--cpus-per-task", "1",
                        "--exclude", "n1", "--sbatch-arg=--comment=sortie-shaped", "--time", "3")
    assert held.returncode == 0, held.stderr
    try:
        # Issue 67 (8): a held allocation's time limit was never shown: its TTL in status.
        row = next(r for r in json.loads(login.sortie("status", "--json").stdout)["sorties"]
                   if r["name"] == "shaped")
        assert 0 < row["ttl_left_s"] <= 180, row
        job = json.loads((login.home / "sortie-home" / "allocations" / "shaped" /
                          "allocation.json").read_text())["job_id"]
        shown = dict(re.findall(r"(\w+)=(\S*)", login.lab.login(
            "scontrol", "-o", "show", "job", job).stdout))
        assert (shown["MinMemoryNode"], shown["ExcNodeList"], shown["Comment"]) == \
            ("100M", "n1", "sortie-shaped"), shown
        assert shown["NodeList"] != "n1" and shown["Partition"] in ("debug", "short"), shown
    finally:
        assert login.sortie("down", "shaped").returncode == 0
    refused = login.sortie("run", "--slurm", "lab", "--sbatch-arg=--ntasks=4")
    assert refused.returncode == 2 and "--sbatch-arg: --ntasks: sortie sets it itself" in \
        refused.stderr, refused.stderr


@contextlib.contextmanager
def killed_in_the_queue(login: Login, name: str) -> Iterator[tuple[str, Path]]:
    """A sortie's `up` killed as its allocation waits behind a job holding every node: (the
    allocation's job id, its directory). When the body has done with it, the blocker goes and
    the queue must empty within a minute; whatever is left of either is cancelled."""
    from sortie.stacks.slurm.hold_script import WAITING

    blocker = login.lab.login("sbatch", "--parsable", "--exclusive", "-N", "3",
                              "--output=/dev/null", "--wrap", "sleep 600").stdout.strip()
    record = login.home / "sortie-home" / "allocations" / name / "allocation.json"

    def waiting() -> bool:  # queued, recorded, and marked as waited for by its controller
        return record.exists() and f"sortie-{name} PENDING" in login.queue() and (
            Path(json.loads(record.read_text())["workdir"]) / WAITING).exists()

    up = login.start("up", "--slurm", "lab", "--nodes", "2", "--name", name)
    try:
        # (on a loaded machine, the record once came seconds after the queue showed the job)
        wait_until(lambda: waiting() or up.poll() is not None, 60, login.queue, pause=0.2)
        assert up.poll() is None, login.queue()
        up.kill()
        up.communicate()
        allocation = json.loads(record.read_text())
        yield allocation["job_id"], Path(allocation["workdir"])
        login.lab.login("scancel", blocker)
        wait_until(lambda: not login.queue(), 60, login.queue)
    finally:
        if up.poll() is None:
            up.kill()
            up.communicate()
        # A failed test leaves no job of its own to hold the lab's nodes from the next tests.
        login.lab.login("scancel", blocker, check=False)
        login.lab.login("scancel", "--name", f"sortie-{name}", check=False)


def ended_holding_nothing(login: Login, job: str) -> None:
    shown = login.lab.login("scontrol", "-o", "show", "job", job).stdout
    assert "JobState=COMPLETED" in shown and "ExitCode=0:0" in shown, shown  # it ran, and ended


def test_an_allocation_whose_controller_died_in_the_queue_ends_itself_when_it_starts(
        login: Login) -> None:
    """Issue 67 (7): a controller killed while its allocation waited in the queue left a job
    that later held the nodes idle (`sleep infinity`) until `reap` or its time limit. Started,
    it finds its controller stopped waiting (`hold_script`) and ends, holding nothing.
    The controller's mark is made ORPHAN_AFTER_S old rather than waited for (issue 63: a
    timer is tested at seconds); that it outlasts the controller's polls is a unit test's."""
    from sortie.stacks.slurm.hold_script import ORPHAN_AFTER_S, WAITING

    with killed_in_the_queue(login, "orphan") as (job, workdir):
        long_ago = time.time() - ORPHAN_AFTER_S - 15  # its last touch, as if that long ago
        os.utime(workdir / WAITING, (long_ago, long_ago))
    ended_holding_nothing(login, job)
    reaped = login.sortie("reap")
    assert reaped.returncode == 0, reaped.stdout + reaped.stderr


def test_an_allocation_whose_directory_went_while_it_was_queued_ends_when_it_starts(
        login: Login) -> None:
    """Seen when a failed test's files were removed under its queued allocation: Slurm started
    the job in /tmp (its directory gone), where no mark said that anyone waited, and it held
    its nodes for nobody until its time limit. It now ends, holding nothing."""
    with killed_in_the_queue(login, "gone") as (job, workdir):
        shutil.rmtree(workdir)
    ended_holding_nothing(login, job)


def test_a_detached_run_is_driven_from_inside_its_allocation_once_the_shell_has_ended(
        login: Login) -> None:
    """Issue 67 (6): submit and log out. `run --detach` checks what was asked, queues the
    allocation with the run's controller as its batch job, and returns; the run then goes on
    with no shell of the user's, and leaves its results where a run does."""
    done = login.sortie("run", "--slurm", "lab", "--nodes", "2", "--steps", "300", "--detach",
                        "--name", "away", "--runs-dir", str(login.runs), "--",
                        "--min-step-s", "0.05", timeout=60)  # long enough to be read back
    assert done.returncode == 0, done.stdout + done.stderr
    said = " ".join(done.stdout.split())
    assert "away: queued as Slurm allocation " in said, said
    log = login.runs / "away.controller.log"
    deadline, seen, read_back = time.monotonic() + 300, set(), False
    while login.queue():  # the allocation ends as its controller exits
        assert time.monotonic() < deadline, log.read_text()[-3000:] if log.exists() else ""
        rows = json.loads(login.sortie("status", "--json").stdout)["sorties"]
        seen |= {r["state"] for r in rows if r["name"] == "away"}
        if "up" in seen and not read_back:  # read back from its nodes while it trains
            logs = login.sortie("logs", "away")
            read_back = logs.returncode == 0 and "step " in logs.stdout
        time.sleep(1.5)  # (each poll is a CLI's start: ~0.5 CPU-seconds)
    assert seen <= {"queued", "up"} and read_back, (seen, read_back)
    result = json.loads((login.runs / "away" / "run.json").read_text())["result"]
    assert result["ok"] and result["summary"]["steps"] == 300, log.read_text()[-3000:]
    [run] = [r for r in json.loads(login.sortie("runs", "--json").stdout)
             if r["id"] == "away"]
    assert run["state"] == "succeeded", run
    assert result["teardown"]["clean"] and (login.runs / "away" / "report.html").is_file()
    assert "world_size=4" in (login.runs / "away" / "logs" / "node-0.log").read_text()
    left = json.loads(login.sortie("status", "--json").stdout)["sorties"]
    assert [r["name"] for r in left] == ["lab"], left  # nothing but the attached cluster
    assert not (login.shared / "sortie-away").exists()
    refused = login.sortie("run", "--detach", "--nodes", "1")
    assert refused.returncode == 2 and refused.stderr.strip() == (
        "sortie: error: --detach: hands the run to a Slurm allocation (its controller runs in "
        "it): add --slurm NAME"), refused.stderr


class ExportsNothing(Login):
    """A user at a site that starts jobs and steps without the submitting shell's environment
    (`SBATCH_EXPORT=NONE`, `SLURM_EXPORT_ENV=NONE` in every login's profile), holding a secret
    in theirs."""

    def _env(self) -> dict[str, str]:
        return {**super()._env(), "SBATCH_EXPORT": "NONE", "SLURM_EXPORT_ENV": "NONE",
                "TEAM_TOKEN": "s3cret"}


def test_a_site_that_exports_no_environment_runs_steps_and_a_detached_runs_secret(
        lab: SlurmLab) -> None:
    """A site unlike the lab's default: before, every srun step failed to start ("node check
    failed: srun: error: n1: task 0: Exited with exit code 2", no PATH to find bash), and a
    detached run's controller lacked the `--env NAME` its shell held (its log said so; the
    submit had said "queued")."""
    user = ExportsNothing(lab, runs_as_lab_user(lab, lab_user()))
    try:
        assert user.sortie("attach", "lab", "--slurm", "--shared-dir", str(user.shared),
                           "--python", str(user.python)).returncode == 0
        user.hello_task()
        (user.home / "job" / "hello.sh").write_text('test "$TEAM_TOKEN" = s3cret || exit 9\n')
        done = user.sortie("run", "hello.yaml", "--slurm", "lab", "--nodes", "2", "--env",
                           "TEAM_TOKEN", "--detach", "--name", "bare", "--runs-dir",
                           str(user.runs))
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        log = user.runs / "bare.controller.log"
        wait_until(lambda: not user.queue(), 240,
                   lambda: log.read_text()[-3000:] if log.exists() else "")
        result = json.loads((user.runs / "bare" / "run.json").read_text())["result"]
        assert result["ok"] and result["node_states"] == {"node-0": "ok", "node-1": "ok"}, \
            result
        assert "s3cret" not in (user.runs / "bare" / "task.yaml").read_text()
    finally:
        for row in json.loads(user.sortie("status", "--json").stdout or "{}").get("sorties", []):
            user.sortie("down", row["name"])
        user.remove()


def test_a_step_slurm_kills_for_its_memory_is_named_with_slurms_reason(login: Login) -> None:
    """Issue 67 (3): where the site counts and enforces memory (the lab: `CR_CPU_Memory`,
    `OverMemoryKill`), a job past its allocation's memory is killed by Slurm; sortie said
    "exit unknown" with an empty log. Slurm's own reason now, and the flag that gives more."""
    (login.home / "job").mkdir(exist_ok=True)
    (login.home / "job" / "hog.py").write_text(
        "import time\nheld = bytearray(900 << 20)\nheld[::4096] = b'x' * len(held[::4096])\n"
        "time.sleep(60)\n")
    (login.home / "hog.yaml").write_text("workdir: job\nrun: $SORTIE_PYTHON hog.py\n")
    done = login.sortie("run", "hog.yaml", "--slurm", "lab", "--nodes", "1", "--mem", "400M",
                        "--runs-dir", str(login.runs), "--name", "hog")
    said = " ".join((done.stdout + done.stderr).split())
    assert done.returncode == 1, said[-2000:]
    assert re.search(r"training failed on node-0 \(Slurm killed its step: it used \d+ MiB of "
                     r"memory, over the 400 MiB the allocation holds \(--mem\)\)", said), said
    run = json.loads((login.runs / "hog" / "run.json").read_text())["result"]
    assert run["node_states"] == {"node-0": "failed"} and "--mem" in run["ended_by"]["node-0"]
    assert login.queue() == []


def test_a_held_allocation_cancelled_outside_keeps_its_logs_and_says_its_nodes_are_gone(
        login: Login) -> None:
    """Issue 67 (8): after an outside `scancel`, `logs` said no job had written any (its exec
    had, and was collected) and `ssh` printed srun's raw error."""
    assert login.sortie("up", "--slurm", "lab", "--nodes", "2", "--name", "gone").returncode == 0
    try:
        ran = login.sortie("exec", "gone", login.hello_task(), "--runs-dir", str(login.runs))
        assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-2000:]
        job = json.loads((login.home / "sortie-home" / "allocations" / "gone" /
                          "allocation.json").read_text())["job_id"]
        login.lab.login("scancel", job)
        wait_until(lambda: login.state("gone") not in ("up", "completing"), 60,
                   "Slurm never ended it")
        logs = login.sortie("logs", "gone")
        assert logs.returncode == 0 and "node-1 | rank 1 of 2 on" in logs.stdout, logs.stderr
        assert "gone: its nodes show no log now; run " in logs.stderr, logs.stderr
        inside = login.sortie("ssh", "gone", "--", "hostname")
        assert inside.returncode == 2 and "its nodes are gone; `sortie down gone` clears it" \
            in inside.stderr and "srun: error" not in inside.stderr, inside.stderr
    finally:
        assert login.sortie("down", "gone").returncode == 0


def test_reap_adopts_a_slurm_sortie_whose_controller_died(login: Login) -> None:
    """The controller is killed mid-run: the job goes on in its allocation; `status` says
    orphaned, `reap` leaves it while it trains, then collects it and cancels the allocation."""
    run = login.start("run", "--slurm", "lab", "--nodes", "2", "-p", "1", "--steps", "400",
                      "--runs-dir", str(login.runs), "--name", "orphan", "--", "--log-every",
                      "10")
    seen: list[str] = []
    assert follow(run, seen, r"step 20/400", 240), "".join(seen)[-3000:]
    run.kill()  # SIGKILL: no teardown, no collection
    run.wait(30)
    status = json.loads(login.sortie("status", "--json").stdout)
    assert [r["state"] for r in status["sorties"] if r["name"] == "orphan"] == ["orphaned"]
    deadline, reaped = time.monotonic() + 300, []
    while time.monotonic() < deadline:
        done = login.sortie("reap", "--json")
        reaped = [r for r in json.loads(done.stdout or "[]") if r["name"] == "orphan"]
        if reaped and reaped[0]["action"] != "left running":
            break
        time.sleep(2)
    assert reaped and reaped[0]["action"] == "torn down", reaped
    summary = json.loads((login.runs / "orphan" / "artifacts" / "summary.json").read_text())
    assert summary["steps"] == 400
    assert login.queue() == []
    # Issue 67 (8): a reaped run was missing from the cost ledger.
    [line] = [json.loads(path.read_text()) for path in
              (login.home / "sortie-home" / "costs").glob("orphan-*.json")]
    assert line["kind"] == "run" and line["accounted_s"] > 10, line


@pytest.mark.timeout(600)
def test_a_preempted_allocation_is_requeued_and_the_job_resumes(login: Login) -> None:
    """A job of a higher-priority partition takes every node: Slurm signals the sortie's job
    (the trainer checkpoints in the partition's grace time) and requeues it; sortie asks for a
    new allocation, which runs once the urgent job is done, and the job resumes to the end."""
    run = login.start("run", "--slurm", "lab", "--nodes", "2", "-p", "1", "--steps", "300",
                      "--ckpt-every", "1000", "--runs-dir", str(login.runs), "--name", "bumped",
                      "--", "--log-every", "10")
    seen: list[str] = []
    assert follow(run, seen, r"step 40/300", 240), "".join(seen)[-3000:]
    urgent = login.lab.login("sbatch", "--parsable", "-p", "urgent", "-N", "3", "--exclusive",
                             "--output=/dev/null", "--wrap", "sleep 5").stdout.strip()
    out, _ = run.communicate(timeout=400)
    output = " ".join(("".join(seen) + out).split())
    assert run.returncode == 0, output[-1500:]
    found = re.search(r"recovery 1: replaced node-0, node-1 \(allocation \d+ (requeued by "
                      r"Slurm|ended)[^;]*\); lost at step (\d+), resumed from step (\d+)", output)
    assert found, output[-3000:]
    lost_at, resumed_from = int(found.group(2)), int(found.group(3))
    assert lost_at >= 40
    assert_saved_where_the_signal_found_it(login.runs / "bumped", lost_at, resumed_from)
    assert urgent.isdigit() and login.queue() == []


def test_a_controller_elsewhere_reaches_the_login_node_over_ssh_with_its_key_pinned(
        lab: SlurmLab, tmp_path: Path) -> None:
    """`attach NAME --slurm USER@LOGIN`: every Slurm command, step, sync and collection goes
    over one SSH connection to the login node (this process has no Slurm configuration: none
    could run here), its host key pinned, never trusted on first use."""
    user = Elsewhere(lab, None, tmp_path)
    ssh = lab.open_login_ssh(getpass.getuser())
    where = [f"{getpass.getuser()}@{ssh.address}:{ssh.port}", "--identity", str(ssh.client_key),
             "--shared-dir", str(user.shared), "--python", sys.executable]
    unpinned = user.sortie("attach", "far", "--slurm", *where)
    assert unpinned.returncode == 2, unpinned.stderr
    assert "never trusts a host on first use" in unpinned.stderr
    other = "SHA256:" + "A" * 43
    wrong = user.sortie("attach", "far", "--slurm", *where, "--trust", f"{ssh.address}={other}")
    assert wrong.returncode == 2 and "refused" in wrong.stderr, wrong.stderr
    attached = user.sortie("attach", "far", "--slurm", *where, "--trust",
                           f"{ssh.address}={fingerprint(ssh.host_key)}")
    assert attached.returncode == 0, attached.stderr
    site = json.loads((user.home / "sortie-home" / "slurm" / "far" / "site.json").read_text())
    assert site["login"]["host_key"] == ssh.host_key
    done = user.sortie("run", "--slurm", "far", "--nodes", "2", "--steps", "20",
                       "--runs-dir", str(user.runs), "--name", "farrun", "--json")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert result["summary"]["steps"] == 20 and result["teardown"]["clean"]
    assert "world_size=4" in (user.runs / "farrun" / "logs" / "node-0.log").read_text()
    held = user.sortie("up", "--slurm", "far", "--nodes", "2", "--name", "farheld")
    assert held.returncode == 0, held.stderr
    ran = user.sortie("exec", "farheld", user.hello_task(), "--runs-dir", str(user.runs))
    assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-2000:]
    assert len({line.split()[-1] for line in (ran.stdout + ran.stderr).splitlines()
                if " of 2 on " in line}) == 2
    inside = user.sortie("ssh", "farheld", "node-1", "--", "hostname")
    assert inside.returncode == 0 and inside.stdout.strip() in {"n1", "n2", "n3"}, inside.stderr
    down = user.sortie("down", "farheld")
    assert down.returncode == 0, down.stderr
    assert user.queue() == [] and not list(user.shared.iterdir())


def python_under(directory: Path) -> Path:
    """A Python whose program lies under ``directory`` (a venv of copies, not links) that
    imports what this one does: this venv's packages and this checkout."""
    import sysconfig

    venv = directory / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--copies", "--without-pip", str(venv)],
                   check=True, capture_output=True, timeout=120)
    (site,) = (venv / "lib").glob("python*/site-packages")
    (site / "this-checkout.pth").write_text(
        f"{sysconfig.get_paths()['purelib']}\n{Path(__file__).resolve().parents[1]}\n")
    return venv / "bin" / "python"


@pytest.mark.timeout(600)
def test_the_slurm_lab_comes_up_attached_runs_a_sortie_and_goes(tmp_path: Path) -> None:
    """Issue 66: the docs' way to try the Slurm backend without a cluster: `sortie slurm-lab up`
    starts the tests' Slurm and attaches it as `lab` (its login node over SSH, pinned); the
    commands that follow work; `slurm-lab down` is refused while a sortie allocates on it, then
    leaves nothing: no daemon, no namespace, no state. Its home and its Python lie under one
    directory only root enters, as root's `/root/.sortie` and `/root/.pyenv` do (before: the
    lab's users' view covered that directory for the Python's sake, and the lab's MariaDB found
    no data directory: "did not answer within 60s")."""
    from sortie.stacks.machine.node_network import NodeNetwork

    closed = tmp_path / "root"
    closed.mkdir(mode=0o700)
    home, python = closed / ".sortie", python_under(closed)

    def sortie(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(python), "-m", "sortie", *args], cwd=tmp_path,
                              env=child_env({"SORTIE_HOME": str(home)}), capture_output=True,
                              text=True, timeout=300)
    up = sortie("slurm-lab", "up", "--nodes", "2")
    assert up.returncode == 0, up.stderr
    shown = " ".join(up.stdout.split())
    assert "Slurm lab up: 2 nodes, partition debug, attached as lab through" in shown, shown
    network = NodeNetwork(home / "slurm-lab")
    try:
        again = sortie("slurm-lab", "up")
        assert again.returncode == 2 and "a lab is up already" in again.stderr, again.stderr
        ran = sortie("run", "--slurm", "lab", "--nodes", "2", "--steps", "10", "--json")
        assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-2000:]
        result = json.loads(ran.stdout)
        assert result["summary"]["steps"] == 10 and result["teardown"]["clean"], result
        held = sortie("up", "--slurm", "lab", "--nodes", "1", "--name", "dev")
        assert held.returncode == 0, held.stderr
        refused = sortie("slurm-lab", "down")
        assert refused.returncode == 2 and refused.stderr.strip() == (
            "sortie: error: slurm-lab: dev allocates on lab: `sortie down dev` first; nothing "
            "was stopped"), refused.stderr
        assert sortie("down", "dev").returncode == 0
    finally:
        down = sortie("slurm-lab", "down")
    assert down.returncode == 0, down.stderr
    assert "Slurm lab stopped and lab detached" in down.stdout
    assert network.namespaces() == [] and not (home / "slurm-lab").exists()
    assert sortie("status").stdout.strip() == "no sorties"


def test_without_accounting_an_allocation_costs_its_time_running_not_queued(
        tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """Issue 67 (8): on a cluster that keeps no accounting (no slurmdbd, as many sites), the
    ledger billed an allocation's time in the queue as time held. Its time running is counted,
    by sortie's clock, and said so. The cluster binds each task to its cores, as many sites
    do: a job's step had one CPU of the allocation's, torchrun and every rank on it."""
    cpus = min(2, len(os.sched_getaffinity(0)))  # (binding lays tasks out on real CPUs)
    bare = SlurmLab(tmp_path / "lab", nodes=1, cpus=cpus, accounting=False, binds_cores=True)
    try:
        bare.start()
        user = Login(bare, runs_as_lab_user(bare, lab_user()))
        request.addfinalizer(user.remove)
        attached = user.sortie("attach", "lab", "--slurm", "--shared-dir", str(user.shared),
                               "--python", str(user.python))
        assert attached.returncode == 0, attached.stderr
        blocker = bare.login("sbatch", "--parsable", "--exclusive", "-N", "1",
                             "--output=/dev/null", "--wrap", "sleep 600").stdout.strip()
        up = user.start("up", "--slurm", "lab", "--nodes", "1", "--cpus-per-task", str(cpus),
                        "--name", "waited")
        try:
            wait_until(lambda: "sortie-waited PENDING" in user.queue() or up.poll() is not None,
                       60, user.queue, pause=0.2)
            assert up.poll() is None, user.queue()
            # Seen queued: 8 s of it, by the test's own clock, before the node is free (a
            # blocker of a fixed 12 s ended once before a loaded machine's `up` had queued).
            time.sleep(8)
            bare.login("scancel", blocker)
            said_up, _ = up.communicate(timeout=120)
            assert up.returncode == 0, said_up
        finally:
            if up.poll() is None:
                up.kill()
                up.communicate()
            bare.login("scancel", blocker, check=False)
        (user.home / "cpus.yaml").write_text("run: grep Cpus_allowed_list /proc/self/status\n")
        job = user.sortie("exec", "waited", "cpus.yaml", "--runs-dir", str(user.runs))
        assert job.returncode == 0, job.stdout[-2000:] + job.stderr[-2000:]
        allowed = "0-1" if cpus == 2 else "0"
        assert re.search(rf"Cpus_allowed_list:\s+{allowed}\b", job.stdout), job.stdout[-2000:]
        down = user.sortie("down", "waited")
        assert down.returncode == 0, down.stderr
        said = re.search(r"held (\d+)s by sortie's clock \(the cluster keeps no accounting\)",
                         " ".join(down.stdout.split()))
        [line] = [json.loads(path.read_text()) for path in
                  (user.home / "sortie-home" / "costs").glob("waited-*.json")]
        # From `up` to `down`'s end, it queued for 8 s at least, however slow a loaded machine
        # made the commands' starts (two clones' tests side by side: its 6 s of running were
        # read as billed queueing against a fixed bound): none of it billed (whole seconds).
        since_up = line["ended"] - line["started"]
        assert said and int(said.group(1)) <= since_up - 6, (down.stdout, line)
        assert line["accounted_s"] <= since_up - 6, line
    finally:
        bare.stop()
