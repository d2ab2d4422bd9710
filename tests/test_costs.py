"""`sortie costs`: every sortie and held cluster's cost from the ledger, this controller's and a
shared state backend's, with totals."""

from __future__ import annotations

import getpass
import json
import os
import re
import time
from pathlib import Path

import pytest

from sortie.core.errors import UsageError
from sortie.cost.budgets import (
    OwnerBudgets,
    check_launch,
    month_start,
    spent_this_month,
    write_budgets,
)
from sortie.cost.ledger import COSTS, CostEntry, read_costs, record_cost
from sortie.cost.summary import costs
from sortie.stacks.listing import SortieRow
from tests.helpers import REPO, needs_sshd, sortie

DAY = 86400.0
NOW = 1_800_000_000.0


def entry(name: str, owner: str, hours: float, rate: float, ended: float = NOW,
          **more) -> CostEntry:
    return CostEntry(name=name, kind="run", backend="aws", owner=owner, nodes=2,
                     usd_per_hour=rate, started=ended - hours * 3600, ended=ended, **more)


@pytest.mark.unit
def test_every_amount_and_rate_is_written_one_way():
    """Issue 65: `$/h` was formatted in seven places, two of them without the thousands comma
    (`status` said "running: $7200.00/h" where `up` said "$7,200.00/h")."""
    from sortie.cost.money import usd, usd_per_hour

    assert (usd(1234.5), usd(0), usd_per_hour(7200)) == ("$1,234.50", "$0.00", "$7,200.00/h")
    sources = [path.read_text() for folder in ("sortie", "stacks", "bootstrap")
               for path in (REPO / folder).rglob("*.py") if path.name != "money.py"]
    assert not [s for s in sources if re.search(r"\$\{[^}]*:,?\.2f\}", s)], \
        "an amount written by hand: sortie.cost.money writes them"


@pytest.mark.unit
def test_the_ledger_totals_by_owner_and_day_and_reads_a_shared_backend(tmp_path: Path):
    home, shared = tmp_path / "home", f"file://{tmp_path / 'shared'}"
    record_cost(home, entry("a", "ana", 2, 10.0, profile="aws-p4d"))
    record_cost(home, entry("b", "bo", 1, 5.0, ended=NOW - 2 * DAY), shared)  # both places
    record_cost(tmp_path / "other-controller", entry("c", "bo", 0.5, 4.0), shared)
    record_cost(home, entry("old", "ana", 1, 1.0, ended=NOW - 40 * DAY))
    report = costs(home, 30 * DAY, "owner", shared, now=NOW)
    assert [e.name for e in report.entries] == ["b", "a", "c"], "once each, the old one left out"
    assert report.totals == {"ana": 20.0, "bo": 7.0} and report.total_usd == 27.0
    assert costs(home, 30 * DAY, "owner", now=NOW).total_usd == 25.0, "without the shared one"
    by_day = costs(home, 30 * DAY, "day", shared, now=NOW).totals
    assert sorted(by_day.values()) == [5.0, 22.0]
    assert costs(home, 30 * DAY, "profile", now=NOW).totals == {"-": 5.0, "aws-p4d": 20.0}


@pytest.mark.unit
def test_a_damaged_ledger_line_is_named_and_skipped(tmp_path: Path):
    record_cost(tmp_path, entry("good", "ana", 1, 1.0))
    (tmp_path / COSTS / "bad-1.json").write_text('{"name": "../x", "cost": 9}')
    entries, unreadable = read_costs(tmp_path)
    assert [e.name for e in entries] == ["good"] and len(unreadable) == 1
    assert unreadable[0].startswith("bad-1.json: damaged (name:"), unreadable


def _ledger_line(tmp_path: Path, name: str, text: str) -> None:
    (tmp_path / COSTS).mkdir(parents=True, exist_ok=True)
    (tmp_path / COSTS / name).write_text(text)


@pytest.mark.unit
def test_money_read_back_is_untrusted_each_bad_entry_skipped_and_named(tmp_path: Path):
    """Third review: `"started": -1e300` crashed `sortie costs`; NaN and 1e400 (infinity)
    passed; in a shared file:// backend a directory named costs/x.json raised, a FIFO hung the
    command, and a 300 MB entry was read whole before its cut."""
    home, shared = tmp_path / "home", tmp_path / "shared"
    record_cost(home, entry("good", "ana", 1, 1.0))
    good = entry("x", "ana", 1, 1.0).model_dump()
    for name, started in (("huge", -1e300), ("nan", "NaN"), ("inf", "1e400"),
                          ("late", 1e15)):
        _ledger_line(home, f"{name}-1.json",
                     json.dumps({**good, "name": name}).replace('"started": ' + str(
                         good["started"]), f'"started": {started}'))
    root = shared / ".sortie" / COSTS
    root.mkdir(parents=True)
    (root / "dir-1.json").mkdir()
    os.mkfifo(root / "fifo-1.json")
    with open(root / "big-1.json", "wb") as big:
        big.truncate(300 << 20)  # sparse: 300 MB that costs no disk
    entries, unreadable = read_costs(home, f"file://{shared}")
    assert [e.name for e in entries] == ["good"]
    named = " ".join(unreadable)
    for name in ("huge-1", "nan-1", "inf-1", "late-1", "dir-1", "fifo-1", "big-1"):
        assert f"{name}.json" in named, (name, unreadable)
    assert "larger than 64 KiB" in named and named.count("not a regular file") == 2
    report = costs(home, 30 * DAY, "day", f"file://{shared}")
    assert report.total_usd == 1.0 and len(report.unreadable) == 7


@pytest.mark.unit
def test_a_damaged_budget_entry_is_skipped_named_and_never_lets_its_owner_spend(tmp_path: Path):
    """Third review: `{"owner": NaN}` let `up --max-cost 5` pass, and `budget set OWNER
    --monthly nan` was stored as null, breaking every later command."""
    from sortie.cost.budgets import BUDGETS_FILE, read_budgets

    (tmp_path / BUDGETS_FILE).write_text(
        '{"monthly_usd": {"ana": NaN, "bo": 10, "cy": -5, "dee": 1e400, "../x": 3}}')
    budgets = read_budgets(tmp_path)
    assert budgets.monthly_usd == {"bo": 10.0}
    assert sorted(budgets.damaged) == ["../x", "ana", "cy", "dee"]
    with pytest.raises(UsageError, match=r"budget: .*'ana': damaged .* `sortie budget set ana"):
        check_launch(tmp_path, "ana", None, 5.0, nothing_running)
    # no budget, nothing damaged of hers: allowed
    check_launch(tmp_path, "eve", None, 5.0, nothing_running)
    (tmp_path / BUDGETS_FILE).unlink()
    os.mkfifo(tmp_path / BUDGETS_FILE)  # never hangs: the whole file is named
    assert "not a regular file" in read_budgets(tmp_path).damaged["*"]
    with pytest.raises(UsageError, match="budget: .*not a regular file"):
        check_launch(tmp_path, "bo", None, 5.0, nothing_running)


@pytest.mark.e2e
@pytest.mark.parametrize("flag", [["budget", "set", "ana", "--monthly"],
                                  ["run", "--max-cost"],
                                  ["up", "--max-cost"],
                                  ["plan", "--gpu", "A100:8", "--max-usd-per-hour"]])
@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e400"])
def test_money_flags_take_finite_amounts_only(tmp_path: Path, flag: list[str], value: str):
    done = sortie(*flag, value, cwd=tmp_path, env={"SORTIE_HOME": str(tmp_path / "home")})
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "is not an amount in dollars" in done.stderr or "give a number" in done.stderr
    assert not (tmp_path / "home" / "budgets.json").exists(), "nothing stored"


@pytest.mark.e2e
@needs_sshd
def test_runs_and_held_clusters_are_in_the_costs(sortie_home: Path, tmp_path: Path):
    rate = {"SORTIE_LOCAL_USD_PER_HOUR": "36"}  # a cent a node-second
    assert sortie("run", "--nodes", "2", "-p", "1", "--steps", "10", "--name", "paid",
                  "--health", "off", cwd=tmp_path, env=rate).returncode == 0
    assert sortie("up", "--nodes", "1", "--name", "kept", cwd=tmp_path).returncode == 0
    assert sortie("down", "kept", cwd=tmp_path).returncode == 0
    done = sortie("costs", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    lines = {e["name"]: e for e in report["entries"]}
    assert lines["paid"]["kind"] == "run" and lines["paid"]["usd_per_hour"] == 72.0
    assert 0 < lines["paid"]["cost"] < 72.0 / 3600 * 120
    assert lines["kept"]["kind"] == "held" and lines["kept"]["cost"] == 0.0
    assert report["total_usd"] == round(lines["paid"]["cost"], 2)
    as_csv = sortie("costs", "--csv", cwd=tmp_path).stdout.splitlines()
    assert as_csv[0].startswith("name,kind,backend") and len(as_csv) == 3


@pytest.mark.e2e
def test_a_shared_ledger_in_an_s3_state_backend(aws_endpoint: str, tmp_path: Path):
    import boto3
    import s3fs

    # fsspec keeps one S3 filesystem per process, bound to the first endpoint it saw: another
    # test's moto server, gone by now.
    s3fs.S3FileSystem.clear_instance_cache()
    boto3.client("s3").create_bucket(Bucket="team-state")
    shared = "s3://team-state/pulumi"
    assert record_cost(tmp_path / "ana", entry("a", "ana", 1, 3.0), shared) is None
    assert record_cost(tmp_path / "bo", entry("b", "bo", 2, 3.0), shared) is None
    keys = {o["Key"] for o in boto3.client("s3").list_objects_v2(
        Bucket="team-state")["Contents"]}
    assert {f"pulumi/.sortie/costs/{n}-{int(NOW - h * 3600)}.json"
            for n, h in (("a", 1), ("b", 2))} == keys
    report = costs(tmp_path / "ana", DAY, "owner", shared, now=NOW)
    assert report.totals == {"ana": 3.0, "bo": 6.0} and report.unreadable == []


def nothing_running() -> list[tuple[str, float]]:
    return []


@pytest.mark.unit
def test_a_month_counts_only_its_own_part_of_each_sortie(tmp_path: Path):
    start = month_start(NOW)
    record_cost(tmp_path, entry("across", "ana", 4, 10.0, ended=start + 3600))  # 1 h this month
    record_cost(tmp_path, entry("last-month", "ana", 1, 10.0, ended=start - 60))
    record_cost(tmp_path, entry("other", "bo", 1, 99.0))
    running = [SortieRow(name="live", backend="aws", owner="ana", usd_so_far=2.5).spend]
    spent = spent_this_month(tmp_path, ["ana", "bo"], running, now=NOW)
    assert spent == {"ana": pytest.approx(12.5), "bo": pytest.approx(99.0)}


@pytest.mark.unit
def test_what_a_clusters_accounting_says_it_held_is_what_is_counted(tmp_path: Path):
    """A Slurm allocation queued 3 of its 4 hours: `sacct` says it held its nodes 1 h, and that
    hour is its cost, in the ledger and (in proportion) in the month's budget."""
    start = month_start(NOW)
    queued = entry("queued", "ana", 4, 10.0, accounted_s=3600.0)
    assert queued.cost == pytest.approx(10.0)
    record_cost(tmp_path, queued)
    record_cost(tmp_path, entry("across", "bo", 4, 10.0, ended=start + 3600, accounted_s=7200))
    spent = spent_this_month(tmp_path, ["ana", "bo"], [], now=NOW)
    assert spent == {"ana": pytest.approx(10.0), "bo": pytest.approx(5.0)}  # 1/4 of 2 h
    back, _ = read_costs(tmp_path)
    assert {e.name: e.accounted_s for e in back} == {"queued": 3600.0, "across": 7200.0}


@pytest.mark.unit
def test_a_launch_that_could_pass_the_owners_budget_is_refused(tmp_path: Path):
    write_budgets(tmp_path, OwnerBudgets(monthly_usd={"ana": 30.0}))
    record_cost(tmp_path, entry("spent", "ana", 0.002, 10000.0, ended=time.time()))  # $20 now
    check_launch(tmp_path, "ana", None, 9.0, nothing_running)  # $10 left: fits
    check_launch(tmp_path, "bo", None, 1e6, nothing_running)  # no budget: nothing to hold to
    check_launch(tmp_path, "ana", None, None, nothing_running)  # no price: nothing to count
    with pytest.raises(UsageError, match=r"budget: ana has \$10.00 of \$30.00 left this month; "
                                         r"this launch may cost up to \$11.00 \(its --max-cost\)"):
        check_launch(tmp_path, "ana", None, 11.0, nothing_running)
    # Local nodes at a notional price, no --max-cost: no TTL ends them, so nothing bounds the
    # cost (before: started, and the budget ended at -$16.58).
    with pytest.raises(UsageError, match=r"this launch has no bound \(\$7,200.00/h, and no TTL "
                                         r"ends it\): give --max-cost \(at most \$10.00\)"):
        check_launch(tmp_path, "ana", None, None, nothing_running, open_usd_per_hour=7200.0)
    # bo has no budget
    check_launch(tmp_path, "bo", None, None, nothing_running, open_usd_per_hour=7200.0)


@pytest.mark.e2e
def test_budgets_are_set_shown_and_refuse_a_launch_before_it_starts(tmp_path: Path):
    home = {"SORTIE_HOME": str(tmp_path / "home"), "SORTIE_LOCAL_USD_PER_HOUR": "36"}
    me = getpass.getuser()
    assert sortie("budget", "set", me, "--monthly", "5", cwd=tmp_path, env=home).returncode == 0
    listed = json.loads(sortie("budget", "list", "--json", cwd=tmp_path, env=home).stdout)
    assert listed == {"budgets": [{"owner": me, "monthly_usd": 5.0, "spent_usd": 0.0,
                                   "left_usd": 5.0}], "damaged": {}}
    refused = sortie("run", "--max-cost", "6", cwd=tmp_path, env=home)
    assert refused.returncode == 2 and refused.stderr.strip().splitlines() == [
        f"sortie: error: budget: {me} has $5.00 of $5.00 left this month; this launch may cost "
        "up to $6.00 (its --max-cost): give a lower --max-cost, or `sortie budget set` more"]
    unbounded = sortie("up", "--nodes", "1", cwd=tmp_path, env=home)
    assert unbounded.returncode == 2 and "this launch has no bound ($36.00/h, and no TTL ends " \
        "it): give --max-cost (at most $5.00)" in unbounded.stderr
    assert not (tmp_path / "home" / "clusters").exists() or \
        not any((tmp_path / "home" / "clusters").iterdir()), "nothing was started"
    status = sortie("status", cwd=tmp_path, env=home).stdout
    assert f"monthly budgets: {me} $5.00 of $5.00 left" in status


@pytest.mark.e2e
@needs_sshd
def test_a_held_local_cluster_has_one_price_everywhere(tmp_path: Path):
    """Before: `up` without --max-cost was priced $0/h, with it priced, and `status` said
    "$0.00/h, $0.00 so far" throughout. The price a local cluster starts with is the one
    `up`, `status`, `exec`'s report and the ledger count, whatever the environment says
    later."""
    home = {"SORTIE_HOME": str(tmp_path / "home"), "SORTIE_LOCAL_USD_PER_HOUR": "3600"}
    up = sortie("up", "--nodes", "2", "--name", "priced", cwd=tmp_path, env=home)
    assert up.returncode == 0, up.stderr
    assert "cost before launch: $7,200.00/h (notional: $3600/h a node " \
           "(SORTIE_LOCAL_USD_PER_HOUR)), fixed for the cluster's life" in up.stdout + up.stderr
    try:
        (tmp_path / "task.yaml").write_text("run: 'true'\n")
        later = {**home, "SORTIE_LOCAL_USD_PER_HOUR": "1"}
        done = sortie("exec", "priced", "task.yaml", "--json", cwd=tmp_path, env=later)
        assert done.returncode == 0, done.stderr
        run = json.loads((tmp_path / json.loads(done.stdout)["artifacts"] / "run.json")
                         .read_text())
        assert run["usd_per_hour"] == 7200.0 and "$3600/h a node" in run["pricing"]
        row = json.loads(sortie("status", "--json", cwd=tmp_path, env=later).stdout)[
            "sorties"][0]
        assert row["usd_per_hour"] == 7200.0 and row["usd_so_far"] > 0
    finally:
        down = sortie("down", "priced", cwd=tmp_path, env=home)
    assert down.returncode == 0, down.stderr
    (held,) = [e for e in read_costs(tmp_path / "home")[0] if e.name == "priced"]
    assert held.usd_per_hour == 7200.0 and held.kind == "held"
