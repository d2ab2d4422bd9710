"""Issue 66 (1): a queue on a held cluster. A second exec waits its turn (first come, first
served) and says its place; --detach returns once the job started or is queued; `sortie jobs`
lists running, queued and ended jobs; `sortie cancel` ends one job (running or queued) and
leaves the cluster up; --no-queue refuses as before. Issue 66 (4): `sortie repair` mends the
cluster in place."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from sortie.stacks.local.local_backend import LocalBackend
from tests.helpers import (
    assert_nothing_left,
    exit_code,
    follow_until,
    loopback_listeners,
    needs_sshd,
    sortie,
    start_sortie,
)

pytestmark = [pytest.mark.e2e, needs_sshd]


def states(tmp_path: Path, name: str) -> dict[str, str]:
    listed = sortie("jobs", name, "--json", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    return {job["id"]: job["state"] for job in json.loads(listed.stdout)}


def test_execs_queue_in_order_detach_and_cancel_leaving_the_cluster_up(sortie_home: Path,
                                                                       tmp_path: Path):
    before = loopback_listeners()
    assert sortie("up", "--nodes", "2", "--name", "q", cwd=tmp_path).returncode == 0
    work = tmp_path / "work"
    work.mkdir()
    # Each job appends its name to a file on the head when it starts: the order they ran in.
    (work / "job.yaml").write_text(
        "workdir: .\nrun: if [ $SORTIE_NODE_RANK = 0 ]; then echo $SORTIE_RUN_ID >> "
        f"{tmp_path}/order; fi; sleep ${{HOLD:-0}}\n")
    (work / "long.yaml").write_text((work / "job.yaml").read_text() + "env: {HOLD: '300'}\n")

    first = sortie("exec", "q", str(work / "long.yaml"), "--detach", "--name", "first",
                   cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith("first: running on q, detached"), first.stdout
    second = sortie("exec", "q", str(work / "job.yaml"), "-d", "--name", "second", cwd=tmp_path)
    assert second.returncode == 0 and second.stdout.startswith("second: queued on q"), \
        second.stdout + second.stderr
    third = start_sortie(tmp_path, "exec", "q", str(work / "job.yaml"), "--name", "third")
    seen: list[str] = []
    follow_until(third, seen, lambda line: "number 2 in line" in line, timeout=120)
    said = " ".join("".join(seen).split())
    assert "q is busy with run first: queued, number 2 in line (`sortie jobs q` lists the " \
           "queue; `sortie cancel q third` leaves it)" in said, said
    assert states(tmp_path, "q") == {"first": "running", "second": "queued", "third": "queued"}

    busy = sortie("repair", "q", cwd=tmp_path)  # never under a running job
    assert busy.returncode == 2 and "job first runs on q: `sortie cancel q` it first" in \
        busy.stderr, busy.stderr
    refused = sortie("exec", "q", str(work / "job.yaml"), "--no-queue", cwd=tmp_path)
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.strip().endswith(
        "q: another `sortie exec` (run first) is using it: not starting another beside it")

    # A queued job cancelled leaves the queue; the running one cancelled ends, and the next
    # in line (third: second is gone) runs; the cluster stays up throughout.
    gone = sortie("cancel", "q", "second", "--json", cwd=tmp_path)
    assert gone.returncode == 0 and json.loads(gone.stdout)["state"] == "interrupted", \
        gone.stdout + gone.stderr
    stopped = sortie("cancel", "q", cwd=tmp_path)
    assert stopped.returncode == 0, stopped.stderr
    assert stopped.stdout.strip() == "first: interrupted; q is still up (`sortie down q` ends it)"
    assert exit_code(third, seen, 120) == 0, "".join(seen)[-3000:]
    assert (tmp_path / "order").read_text().split() == ["first", "third"]
    jobs = states(tmp_path, "q")
    assert [jobs[run] for run in ("first", "second", "third")] == \
        ["interrupted", "interrupted", "succeeded"]
    nothing = sortie("cancel", "q", cwd=tmp_path)
    assert nothing.returncode == 2 and "JOB: no job runs on q" in nothing.stderr

    status = json.loads(sortie("status", "--json", cwd=tmp_path).stdout)["sorties"]
    assert [(row["name"], row["state"]) for row in status] == [("q", "up")]

    # Mended in place (issue 66.4): a lost node is replaced, bootstrapped and checked; before,
    # only `down` and `up` mended a degraded cluster.
    healthy = sortie("repair", "q", cwd=tmp_path)
    assert healthy.returncode == 0 and "q: every node is up and healthy; nothing to repair" in \
        healthy.stdout, healthy.stdout + healthy.stderr
    assert LocalBackend(sortie_home).reclaim("q", "node-1"), "node-1 had processes to kill"
    status = json.loads(sortie("status", "--json", cwd=tmp_path).stdout)["sorties"]
    assert (status[0]["state"], status[0]["nodes_up"]) == ("degraded", 1)
    mended = sortie("repair", "q", "--json", cwd=tmp_path)
    assert mended.returncode == 0, mended.stderr
    report = json.loads(mended.stdout)
    assert report["replaced"] == {"node-1": "machine gone"} and report["health"]["bad"] == {}
    status = json.loads(sortie("status", "--json", cwd=tmp_path).stdout)["sorties"]
    assert (status[0]["state"], status[0]["nodes_up"]) == ("up", 2)
    after = sortie("exec", "q", str(work / "job.yaml"), "--name", "after", cwd=tmp_path)
    assert after.returncode == 0, after.stderr
    quiet = sortie("logs", "q", "node-1", cwd=tmp_path)  # (its job printed nothing on node-1)
    assert quiet.returncode == 0 and quiet.stderr.strip() == \
        "q: its newest job, run after, has written no log on node-1", quiet.stderr

    # A node lost under a job: the failure names it, first; the cluster is repaired after.
    lost = start_sortie(tmp_path, "exec", "q", str(work / "long.yaml"), "--name", "lost",
                        "--json")
    deadline = time.monotonic() + 120
    order = tmp_path / "order"
    while states(tmp_path, "q").get("lost") != "running" or order.read_text().split()[-1] != \
            "lost":
        assert time.monotonic() < deadline and lost.poll() is None, "the job never started"
        time.sleep(0.2)
    LocalBackend(sortie_home).reclaim("q", "node-1")
    out, _ = lost.communicate(timeout=120)
    report, _ = json.JSONDecoder().raw_decode(out, out.index("\n{") + 1)  # (stderr follows)
    assert lost.returncode == 1 and report["first_failed"] == "node-1", out[-2000:]
    assert report["node_states"]["node-1"] == "lost", report["node_states"]
    assert json.loads(sortie("repair", "q", "--json", cwd=tmp_path).stdout)["replaced"] == \
        {"node-1": "machine gone"}
    # A detached exec's input is checked before it detaches: exit 2 here, not in a log.
    bad = sortie("exec", "q", str(work / "missing.yaml"), "-d", cwd=tmp_path)
    assert bad.returncode == 2 and "missing.yaml" in bad.stderr, bad.stderr
    assert sortie("down", "q", cwd=tmp_path).returncode == 0
    assert_nothing_left(sortie_home, before)


def test_a_spent_budget_ends_the_running_job_and_the_queue_with_the_cluster(sortie_home: Path,
                                                                           tmp_path: Path):
    """Issue 66 (1): a budget stops the queue. A held cluster at $1 a second a node with $45 to
    spend ends itself mid-job; the job running and the one waiting behind it both end, each
    recorded as ended (neither left `running` or `queued` in the history), nothing left. (With
    $20, two clones' tests side by side took longer than 20 s to `up` and queue both jobs.)"""
    before = loopback_listeners()
    priced = {"SORTIE_LOCAL_USD_PER_HOUR": "3600"}
    assert sortie("up", "--nodes", "1", "--name", "spent", "--max-cost", "45", cwd=tmp_path,
                  env=priced).returncode == 0
    work = tmp_path / "work"
    work.mkdir()
    (work / "long.yaml").write_text("workdir: .\nrun: sleep 300\n")
    first = sortie("exec", "spent", str(work / "long.yaml"), "-d", "--name", "first",
                   cwd=tmp_path)
    assert first.stdout.startswith("first: running on spent"), first.stdout + first.stderr
    second = sortie("exec", "spent", str(work / "long.yaml"), "-d", "--name", "second",
                    cwd=tmp_path)
    assert second.stdout.startswith("second: queued on spent"), second.stdout + second.stderr
    state, deadline = LocalBackend(sortie_home).state_dir("spent"), time.monotonic() + 120
    while state.is_dir():
        assert time.monotonic() < deadline, "the budget never ended the cluster"
        time.sleep(0.5)
    deadline = time.monotonic() + 60
    while (runs := {r["id"]: r["state"] for r in json.loads(
            sortie("runs", "--cluster", "spent", "--json", cwd=tmp_path).stdout)}) and \
            {runs.get("first"), runs.get("second")} & {"running", "queued"}:
        assert time.monotonic() < deadline, runs
        time.sleep(1)
    assert set(runs) == {"first", "second"} and "succeeded" not in runs.values(), runs
    assert_nothing_left(sortie_home, before)
