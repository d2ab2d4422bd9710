"""Slurm's own commands, as sortie asks them on the login node: `sbatch`, `squeue`, `scontrol`,
`scancel` and `srun`, each answer read as untrusted input (a state, a time, an address, a node's
interface), each refusal in Slurm's own words."""

from __future__ import annotations

import re
import shlex
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sortie.core.errors import SortieError, UsageError
from sortie.core.inventory import HOST, LoginHost

SLURM_TIMEOUT_S = 60.0
# Waiting in the queue: polled at first often (a free cluster starts a job within a second),
# then backing off to one `scontrol show job` (its state, reason and Slurm's estimated start:
# two RPCs, with the federation query) every POLL_MAX_S. A site's slurmctld counts every RPC,
# and admins ban tools that poll it many times a second (issue 67: ~26 a second before).
POLL_FIRST_S, POLL_MAX_S = 0.2, 10.0
SAY_AFTER_S = 2.0  # an allocation that starts within this says nothing of its wait
# Squeue's states of a job that still holds (or will hold) nodes.
LIVE_STATES = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED",
               "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED"}
# `own_dir`'s script: exits FOREIGN, saying owner and mode, where the directory is not ours.
FOREIGN = 3
OWN_DIR = (
    'w=$1; mkdir -m 700 -- "$w" 2>/dev/null && exit 0\n'
    '[ -d "$w" ] && [ ! -L "$w" ] && [ -O "$w" ] && [ -z "$(find "$w" -maxdepth 0 -perm /077)" ]'
    ' && exit 0\n'
    '[ -e "$w" ] || [ -L "$w" ] || { mkdir -m 700 -- "$w"; exit; }\n'
    'stat -c "owner uid %u, mode %a" -- "$w"; exit 3')
TRANSIENT_STATES = ("COMPLETING", "SIGNALING")  # what `settled_state` waits out
SLURM_TOOLS = ("sbatch", "squeue", "scontrol", "scancel", "srun")
# A pending job's reasons that no wait resolves: the request itself is refused.
REFUSED = re.compile(r"not allowed|NotAllowed|allows|not known|Invalid|PartitionConfig|"
                     r"PartitionNodeLimit|PartitionTimeLimit")
MESSAGE = re.compile(r"(?:sbatch|srun|squeue|scontrol|scancel): error: (.+)")


@dataclass(frozen=True)
class SlurmQueue:
    """Slurm's commands on one cluster's login node: this machine (``login`` None), or one
    reached over SSH with its host key pinned."""

    login: LoginHost | None = None

    def on_login(self, *argv: str, timeout: float = SLURM_TIMEOUT_S
                 ) -> subprocess.CompletedProcess[str]:
        """``argv`` on the login node, its output as text; a missing program is said."""
        if self.login is None:
            try:
                return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
            except FileNotFoundError:
                return subprocess.CompletedProcess(argv, 127, "", f"{argv[0]}: not found")
            except subprocess.TimeoutExpired:
                raise SortieError(f"`{argv[0]}` did not answer within {timeout:.0f}s: is "
                                  "slurmctld reachable from the login node?") from None
        # Over SSH only: a command that never reaches a login node (`status`) loads no SSH.
        from invoke.exceptions import CommandTimedOut

        from sortie.bootstrap.ssh import login_connection
        try:
            done = login_connection(self.login).run(shlex.join(argv), timeout=timeout)
        except CommandTimedOut:
            raise SortieError(f"`{argv[0]}` did not answer within {timeout:.0f}s on the login "
                              f"node {self.login.address}: is slurmctld reachable?") from None
        return subprocess.CompletedProcess(argv, done.exited, done.stdout, done.stderr)

    def slurm(self, *argv: str, timeout: float = SLURM_TIMEOUT_S
              ) -> subprocess.CompletedProcess[str]:
        """A Slurm command on the login node; a missing one is said."""
        done = self.on_login(*argv, timeout=timeout)
        if done.returncode == 127 and "not found" in done.stderr:
            where = "here" if self.login is None else f"on {self.login.address}"
            raise SortieError(f"`{argv[0]}` not found {where}: sortie's Slurm commands run on "
                              "the login node, where Slurm's client commands are")
        return done

    def job_state(self, job_id: str) -> tuple[str, float | None]:
        """(Slurm's state of the job, seconds left to its time limit: None without one);
        ("", None) once it is gone from the queue."""
        if not job_id:
            return "", None
        done = self.slurm("squeue", "-h", "-j", job_id, "-o", "%T %L")
        if done.returncode != 0 and "Invalid job id" not in done.stderr:
            raise SortieError(f"squeue: {slurm_message(done)}")
        words = done.stdout.split() + ["", ""]
        return words[0], slurm_seconds(words[1])

    def wait_running(self, job_id: str, nodes: int, timeout_s: float | None = None,
                     say: Callable[[str], None] | None = None,
                     waiting: Callable[[], None] = lambda: None) -> list[str]:
        """The job's ``nodes`` hosts once it runs; a refusal no wait resolves is a UsageError,
        a job that ends, or waits past ``timeout_s`` (None: as long as it takes), a
        SortieError. ``say`` gets a line whenever the wait changes: the job, Slurm's reason,
        its estimated start. ``waiting`` is called at each poll (`hold_script`)."""
        started, pause, told = time.monotonic(), POLL_FIRST_S, ""
        while True:
            state, node_list, reason, start = self.job_wait(job_id)
            if state == "RUNNING":
                break
            if reason in PARTITION_LIMITS:  # (queued, never to run: said in words)
                flag, why = self.partition_refusal(job_id)
                raise UsageError(f"{flag}: Slurm will not run the allocation: {why}")
            if REFUSED.search(reason):  # what `--test-only` does not check (AllowAccounts)
                raise UsageError(f"{flag_of(reason)}: Slurm refused the allocation: {reason}")
            if state not in LIVE_STATES:
                raise SortieError(f"it ended before it ran ({state or 'gone from the queue'})")
            waited = time.monotonic() - started
            if timeout_s is not None and waited > timeout_s:
                raise SortieError(f"still {state.lower()} ({reason or 'no reason given'}) after "
                                  f"{waited:.0f}s in the queue (--queue-timeout)")
            line = f"allocation {job_id} {state.lower()}" + (f" ({reason})" if reason else "") \
                + (f"; Slurm's estimated start {start}" if start else "")
            if say is not None and line != told and waited >= SAY_AFTER_S:
                say(line)
                told = line
            waiting()
            time.sleep(pause)
            pause = min(pause * 1.5, POLL_MAX_S)
        hosts = self.slurm("scontrol", "show", "hostnames", node_list).stdout.split()
        if len(hosts) != nodes:
            raise SortieError(f"Slurm gave {len(hosts)} nodes ({node_list!r}), not {nodes}")
        return hosts

    def job_wait(self, job_id: str) -> tuple[str, str, str, str]:
        """(Slurm's state of the job, its node list, why it waits, when Slurm expects it to
        start): one `scontrol show job`, one RPC; ("", "", "", "") once it is gone."""
        done = self.slurm("scontrol", "-o", "show", "job", job_id)
        if done.returncode != 0:
            if "Invalid job id" in done.stderr:
                return "", "", "", ""
            raise SortieError(f"scontrol: {slurm_message(done)}")
        fields = fields_of(done.stdout)
        state = fields.get("JobState", "")
        node_list = fields.get("NodeList", "")
        reason = fields.get("Reason", "")[:300].replace("_", " ")  # (scontrol's spaces)
        start = fields.get("StartTime", "") if state == "PENDING" else ""
        return (state, "" if node_list == "(null)" else node_list,
                "" if reason in ("None", "(null)") else reason,
                start if re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d", start) else "")

    def default_partition(self) -> str:
        """The cluster's default partition ("" when it has none)."""
        names = self.slurm("sinfo", "-h", "-o", "%P").stdout.split()
        return next((name.rstrip("*") for name in names if name.endswith("*")), "")

    def node_cpus(self, partitions: str | None) -> int | None:
        """The CPUs of the smallest node in ``partitions`` ("gpu,debug"; None: the default
        partition), None when Slurm does not say."""
        shown = self.slurm("sinfo", "-h", "-N", "-p", partitions or self.default_partition(),
                           "-o", "%c").stdout
        counts = [int(found.group()) for line in shown.splitlines()[:10_000]
                  if (found := re.match(r"[0-9]{1,6}", line.strip()))]
        return min(counts) if counts else None

    def partition_nodes(self, partition: str) -> tuple[int, list[str]]:
        """How many nodes the partition has, whatever their state, and those unavailable now,
        each "name (state: reason)"."""
        shown = self.slurm("sinfo", "-h", "-N", "-p", partition, "-o", "%N|%t|%E").stdout
        nodes: dict[str, str] = {}
        for line in shown.splitlines()[:10_000]:
            name, _, rest = line.partition("|")
            state, _, reason = rest.partition("|")
            if name and (state.rstrip("*~#!%$@^-").lower() in UNAVAILABLE or "*" in state):
                nodes[name] = f"{name} ({state}" + (f": {reason.strip()[:80]})" if reason.strip()
                                                   and reason.strip() != "none" else ")")
            else:
                nodes.setdefault(name, "")
        return len(nodes), [said for said in nodes.values() if said]

    def partition_refusal(self, job_id: str) -> tuple[str, str]:
        """A job pending on its partition's limits (PartitionConfig, PartitionTimeLimit,
        PartitionNodeLimit) in words: (the flag, which limit and both figures)."""
        job = self.job_fields(job_id)
        partition = job.get("Partition", "")
        limits = fields_of(self.slurm("scontrol", "-o", "show", "partition", partition).stdout)
        asked_s, most_s = slurm_seconds(job.get("TimeLimit", "")), \
            slurm_seconds(limits.get("MaxTime", ""))
        if asked_s is not None and most_s is not None and asked_s > most_s:
            return "--time", (f"its time limit {job.get('TimeLimit')} is longer than partition "
                              f"{partition}'s MaxTime {limits.get('MaxTime')}")
        nodes, most_nodes = job.get("NumNodes", ""), limits.get("MaxNodes", "")
        if nodes.isdigit() and most_nodes.isdigit() and int(nodes) > int(most_nodes):
            return "--nodes", f"{nodes} nodes, more than partition {partition}'s MaxNodes " \
                f"{most_nodes}"
        return "--partition", f"the request passes a limit of partition {partition} " \
            f"(`scontrol show partition {partition}`)"

    def own_dir(self, path: Path) -> str:
        """Make ``path`` on the shared disk (mode 700), or take one this user made before (a
        name held again: theirs, no group or other bits); "" when done, else why not. Never one
        that exists otherwise (a UsageError): in a directory others can write in (a mode-1777
        scratch) another user could have made it first and seeded what every node runs."""
        made = self.on_login("sh", "-c", OWN_DIR, "sh", str(path))
        if made.returncode == FOREIGN:
            raise UsageError(f"--shared-dir: {path} exists and is not this user's own directory "
                             f"of mode 700 ({made.stdout.strip()[:80]}): sortie works only in "
                             "one it made (another user could have put what it runs there); "
                             "remove it, or choose another name")
        return "" if made.returncode == 0 else made.stderr.strip() or "mkdir failed"

    def settled_state(self, job_id: str, timeout: float = SLURM_TIMEOUT_S
                      ) -> tuple[str, float | None]:
        """(The job's state once it is no longer completing or being signalled, seconds left to
        its time limit: None without one). SIGNALING passes within moments (Slurm delivering
        the time limit's signal to a job that still runs): read as it, a time limit looked like
        an allocation that had ended."""
        deadline = time.monotonic() + timeout
        while True:
            done = self.slurm("squeue", "-h", "-j", job_id, "-o", "%T %L") if job_id else None
            words = (done.stdout.split() if done else []) + ["", ""]
            if words[0] not in TRANSIENT_STATES or time.monotonic() > deadline:
                return words[0], slurm_seconds(words[1])
            time.sleep(0.2)

    def end_state(self, job_id: str) -> str:
        """How Slurm says the job ended (CANCELLED, TIMEOUT, NODE_FAIL, PREEMPTED...), while it
        still keeps it (MinJobAge); "" when it no longer does."""
        found = re.match(r"[A-Z_]+", self.job_field(job_id, "JobState") or "")
        return found.group(0) if found else ""

    def preempting(self, job_id: str) -> bool:
        """Whether Slurm is preempting the job (its PreemptTime is set: it is in its grace time)."""
        return self.job_field(job_id, "PreemptTime") not in (None, "None", "Unknown")

    def restarts(self, job_id: str) -> int:
        """How often Slurm has requeued the job (it keeps its id and runs again)."""
        shown = self.job_field(job_id, "Restarts") or "0"
        return int(shown) if shown.isdigit() else 0

    def requeued_why(self, job_id: str) -> str:
        """Why Slurm requeued a job (its Reason, or its last failure: "NodeDown"), else ""."""
        reason = self.job_field(job_id, "Reason")
        return reason[:80] if reason and reason != "None" else ""

    def job_fields(self, job_id: str) -> dict[str, str]:
        """The fields of `scontrol show job` (none once it is gone)."""
        return fields_of(self.slurm("scontrol", "-o", "show", "job", job_id).stdout)

    def job_field(self, job_id: str, name: str) -> str | None:
        """One field of `scontrol show job` (its word after ``name=``); None when not shown."""
        return self.job_fields(job_id).get(name) or None

    def cancel(self, job_id: str, timeout: float = SLURM_TIMEOUT_S) -> str:
        """End the job and wait until `squeue` no longer shows it holding anything; returns
        its state if it still does after ``timeout`` ("" once it holds nothing). Its batch
        script (which ignores SIGTERM: a preemption's grace is the job's) is killed first: a
        plain `scancel` would wait the cluster's KillWait (30 s by default) for it."""
        self.slurm("scancel", "--batch", "--signal=KILL", job_id)  # (a pending job: refused)
        self.slurm("scancel", job_id)
        deadline = time.monotonic() + timeout
        while True:
            state, _left = self.job_state(job_id)
            if state not in LIVE_STATES:
                return ""
            if time.monotonic() > deadline:
                return state
            time.sleep(0.2)

    def accounted_s(self, job_ids: list[str], timeout: float = 15.0) -> float | None:
        """How long Slurm's accounting (`sacct`) says the jobs held their nodes, every run of
        each (a requeued job runs again under its id), once it has them all ended (or after
        ``timeout``); None where the cluster keeps no accounting."""
        deadline = time.monotonic() + timeout
        while True:
            done = self.slurm("sacct", "-X", "-D", "-n", "-P", "-j", ",".join(job_ids), "-o",
                              "JobIDRaw,State,ElapsedRaw")
            if done.returncode != 0:
                return None  # "Slurm accounting storage is disabled"
            rows = accounting_rows(done.stdout)
            running = any(state in ("RUNNING", "COMPLETING") for state, _ in rows)
            if rows and (not running or time.monotonic() > deadline):
                return float(sum(seconds for _, seconds in rows))
            if time.monotonic() > deadline:
                return None
            time.sleep(0.5)

    def node_address(self, host: str) -> str:
        """A node's address as Slurm has it (NodeAddr), checked as any address a node hands us."""
        shown = self.slurm("scontrol", "show", "node", host, "-o").stdout
        found = re.search(r"\bNodeAddr=(\S+)", shown)
        address = found.group(1) if found else host
        if not HOST.fullmatch(address):
            raise SortieError(f"{host}: Slurm's NodeAddr {address[:80]!r} is not an address")
        return address


MAX_ELAPSED_S = 10**9  # ~31 years: no allocation was held longer


def accounting_rows(shown: str) -> list[tuple[str, int]]:
    """`sacct -P -o JobIDRaw,State,ElapsedRaw` lines as (state, seconds): Slurm's answer, read
    as untrusted (a line without a state, seconds that are no plain ASCII number or beyond
    reason is skipped, never a traceback that loses the teardown's cost line)."""
    rows = []
    for line in shown.splitlines()[:1000]:
        fields = line.split("|")
        if len(fields) != 3 or not re.fullmatch(r"[0-9]{1,10}", fields[2]):
            continue
        state, seconds = (fields[1].split() or [""])[0], int(fields[2])
        if state and seconds <= MAX_ELAPSED_S:
            rows.append((state, seconds))
    return rows


def fields_of(shown: str) -> dict[str, str]:
    """`scontrol -o show ...`'s one line as its fields (``Key=value`` words, the first 20 kB)."""
    return dict(re.findall(r"(?:^|\s)(\w+)=(\S*)", shown[:20_000]))


def slurm_message(done: subprocess.CompletedProcess[str]) -> str:
    """Slurm's own reason, one line (its last `error:` line), else the last line."""
    lines = done.stderr.strip().splitlines() or [f"exit {done.returncode}"]
    said = [m.group(1) for line in lines if (m := MESSAGE.search(line))]
    return (said or lines)[-1].strip()[:300]


# A pending job's reasons that say it passes its partition's limits: it will never run.
PARTITION_LIMITS = ("PartitionConfig", "PartitionTimeLimit", "PartitionNodeLimit")
# What `sbatch --test-only` refuses that waiting may mend: nodes drained, down or reserved now.
NOT_NOW = re.compile(r"Requested node configuration is not available|Required node not "
                     r"available|ReqNodeNotAvail|Reservation", re.IGNORECASE)
UNAVAILABLE = ("drain", "drng", "down", "maint", "resv", "fail", "futr", "inval", "unk")


def flag_of(message: str) -> str:
    """Which of our flags Slurm's message is about."""
    text = message.lower()
    for word, flag in (("account", "--account"), ("qos", "--qos"),
                       ("reservation", "--reservation"), ("feature", "--constraint"),
                       ("memory", "--mem"), ("cpu count", "--cpus-per-task"),
                       ("partition", "--partition"), ("time limit", "--time"),
                       ("gres", "--gpus-per-node"), ("node", "--nodes")):
        if word in text:
            return flag
    return "--slurm"


def slurm_seconds(shown: str) -> float | None:
    """Slurm's "[days-]hours:minutes:seconds" (or fewer fields) in seconds; None otherwise."""
    days, _, clock = shown.rpartition("-")
    fields = clock.split(":")
    if not all(f.isdigit() for f in fields) or (days and not days.isdigit()) or len(fields) > 3:
        return None
    seconds = sum(int(f) * 60 ** i for i, f in enumerate(reversed(fields)))
    return seconds + int(days or 0) * 86400


# With a time limit, Slurm signals the job this long before it ends (a quarter of the limit,
# at most 90 s): the trainer checkpoints and stops, and a new allocation resumes. Slurm may
# send it up to SIGNAL_EARLY_S sooner (it checks limits every 30 s).
SIGNAL_LEAD_S, SIGNAL_EARLY_S = 90, 60


def signal_lead_s(time_limit: str) -> int:
    """How long before ``time_limit`` (Slurm's format) the job is signalled."""
    return max(10, min(SIGNAL_LEAD_S, int(time_limit_s(time_limit) // 4)))


def time_limit_s(text: str) -> float:
    """A time limit as sbatch takes it, in seconds: "M", "M:S", "H:M:S", "D-H", "D-H:M",
    "D-H:M:S" (0 when unreadable)."""
    days, dash, clock = text.rpartition("-")
    fields = clock.split(":")
    if not all(f.isdigit() for f in fields) or (dash and not days.isdigit()) or len(fields) > 3:
        return 0.0
    numbers = [int(f) for f in fields]
    if dash:  # D-H[:M[:S]]
        numbers += [0] * (3 - len(numbers))
        return int(days) * 86400 + numbers[0] * 3600 + numbers[1] * 60 + numbers[2]
    if len(numbers) == 3:
        return numbers[0] * 3600 + numbers[1] * 60 + numbers[2]
    return numbers[0] * 60 + (numbers[1] if len(numbers) == 2 else 0)
