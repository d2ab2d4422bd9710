"""`sortie up --stack PROFILE`: a cloud cluster held for an afternoon of `exec`s, through the real
command line and the real Pulumi backend on the in-repo stack double (whose machines are real
sshd nodes). What needs the Pulumi CLI or a cloud account is the double's: the Automation API's
stacks, the credential check and the tag sweep."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sortie.cli import app as cli
from sortie.engine import reap
from sortie.engine.held_cluster import hold_cluster
from sortie.fleet.status import status as fleet_status
from sortie.stacks.local.local_backend import LocalBackend
from tests.helpers import Recorder, assert_nothing_left, needs_sshd
from tests.stack_double import DoubleCloud, DoubleStack

pytestmark = pytest.mark.e2e

JOB = """\
import os
print("rank", os.environ["RANK"], "of", os.environ["WORLD_SIZE"], flush=True)
"""


@pytest.fixture
def cloud(tmp_path: Path, sortie_home: Path, monkeypatch: pytest.MonkeyPatch,
          own_profiles: Path) -> Iterator[DoubleCloud]:
    """The stack double in place of the Pulumi CLI and the cloud's APIs, for the real CLI."""
    import sortie.stacks.cloud.automation as automation
    import sortie.stacks.cloud.pulumi_backend as pulumi_backend

    double = DoubleCloud(tmp_path)
    monkeypatch.setattr(automation, "AutomationStacks", lambda home, backend_url=None: double)
    monkeypatch.setattr(automation, "require_cloud_tools", lambda cloud, what: None)
    monkeypatch.setattr(pulumi_backend, "sweep_by_tags", double.sweep)
    monkeypatch.setattr(pulumi_backend, "running_machines", double.running)
    monkeypatch.setattr(pulumi_backend, "offered_zones", lambda spec: list(double.offered_zones))
    handler = signal.getsignal(signal.SIGTERM)  # the CLI installs its own
    yield double
    signal.signal(signal.SIGTERM, handler)


@pytest.fixture
def work(tmp_path: Path) -> Path:
    """A user's workdir with a job that says which rank it is."""
    path = tmp_path / "work"
    path.mkdir()
    (path / "job.py").write_text(JOB)
    return path


def sortie(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """The real command line, in this process (so that it drives the double): (exit code,
    stdout, stderr)."""
    code = cli.main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@needs_sshd
def test_up_stack_holds_a_cloud_cluster_for_execs_until_down(
        cloud: DoubleCloud, work: Path, tmp_path: Path, sortie_home: Path,
        capsys: pytest.CaptureFixture[str]):
    code, out, _ = sortie(capsys, "up", "--stack", "aws-p3-dev", "--nodes", "2", "--name",
                          "afternoon")
    assert code == 0, out
    # p3.2xlarge: head on-demand, one spot worker; the profile's TTL is 2 h.
    assert "cost before launch: aws-p3-dev: 2 x p3.2xlarge in us-east-1, spot workers, " \
           "on-demand head: estimated $" in out and "the 2 h TTL caps it at $" in out
    assert out.index("cost before launch") < out.index("Starting 2 aws nodes")
    assert "held afternoon: `sortie exec afternoon" in out
    record = cloud.records.load("afternoon")
    assert record.held and record.controller is None, "held: no controller drives it"
    stack = cloud.stacks["afternoon"]
    assert stack.settings["sortie:expiresAt"], "the TTL is armed on the nodes"
    assert stack.calls == ["up"]

    code, out, _ = sortie(capsys, "status", "--json")
    [row] = json.loads(out)["sorties"]
    assert (row["name"], row["backend"], row["state"], row["nodes"]) == \
        ("afternoon", "aws", "up", 2)
    assert row["usd_per_hour"] == record.usd_per_hour > 0
    assert "held with `sortie up`" in row["detail"]
    assert sortie(capsys, "reap") == (0, "", ""), "a held cluster within its TTL is left alone"

    runs = tmp_path / "runs"
    for attempt in range(2):
        code, out, progress = sortie(capsys, "exec", "afternoon", "--workdir", str(work),
                                     "--script", "job.py", "--runs-dir", str(runs), "--json")
        assert code == 0, progress
        report = json.loads(out)
        assert report["ok"] and report["teardown"] is None, "exec leaves the cluster up"
        logs = "".join(log.read_text() for log in (runs / report["run_id"] / "logs").glob("*"))
        assert "rank 0 of 2" in logs and "rank 1 of 2" in logs
        assert ("workdir unchanged on node-0, node-1" in progress) == (attempt == 1)
        run = json.loads((runs / report["run_id"] / "run.json").read_text())
        assert (run["backend"], run["profile"]) == ("aws", "aws-p3-dev")
        assert run["usd_per_hour"] == record.usd_per_hour  # the report's cost: this rate
        assert run["pricing"] == "spot workers, on-demand head"
    assert cloud.stacks["afternoon"].calls == ["up"], "exec never touches the stack"

    code, out, _ = sortie(capsys, "down", "afternoon")
    assert code == 0, out
    assert "0 resources remain" in out
    assert_nothing_left(sortie_home, cloud=cloud, name="afternoon")


@needs_sshd
def test_a_held_cloud_cluster_past_its_ttl_is_refused_then_reaped(
        cloud: DoubleCloud, work: Path, sortie_home: Path,
        capsys: pytest.CaptureFixture[str]):
    assert sortie(capsys, "up", "--stack", "aws-p3-dev", "--name", "short")[0] == 0
    code, _, err = sortie(capsys, "up", "--stack", "aws-p3-dev", "--name", "short")
    assert code == 2 and "--name: a sortie named 'short' exists" in err
    assert cloud.stacks["short"].calls == ["up"], "the second `up` touched nothing"
    driven = cloud.backend(sortie_home)
    driven.up("driven", 1)  # a `sortie run`'s cluster: its controller (this process) drives it
    code, _, err = sortie(capsys, "exec", "driven", "--workdir", str(work), "--script",
                          "job.py")
    assert code == 2 and "a sortie `sortie run` drives" in err
    assert driven.down("driven").clean

    cloud.backend(sortie_home)._update("short", expires_at=time.time() - 60)
    code, _, err = sortie(capsys, "exec", "short", "--workdir", str(work), "--script",
                          "job.py")
    assert code == 2 and "'short' is expired (held with `sortie up`, past its TTL" in err
    code, out, _ = sortie(capsys, "reap")
    assert code == 0 and "short: nothing was trained on it" in out and \
        "0 resources remain" in out
    assert_nothing_left(sortie_home, cloud=cloud, name="short")


@needs_sshd
def test_a_cloud_cluster_that_never_becomes_usable_is_destroyed(tmp_path: Path,
                                                                sortie_home: Path):
    """A node that dies while it boots fails the checks: the cluster is destroyed with proof,
    never held half-usable. A launch with no capacity anywhere leaves nothing either."""
    cloud = DoubleCloud(tmp_path)
    backend = cloud.backend(sortie_home)

    class NodeDiesAtBoot(Recorder):
        def phase_started(self, title: str) -> None:
            if title.startswith("Checking every node"):
                cloud.reclaim("boot", "node-1")

    reporter = NodeDiesAtBoot()
    with pytest.raises(Exception, match="node-1"):
        hold_cluster(backend, 2, "boot", reporter, ssh_timeout_s=3)
    assert any("0 resources remain" in note for note in reporter.notes), reporter.notes
    assert_nothing_left(sortie_home, cloud=cloud, name="boot")

    cloud.capacity = {(None, True): 0, (None, False): 0}
    with pytest.raises(Exception, match="no launch attempt brought up all 2 nodes"):
        hold_cluster(backend, 2, "none", Recorder())
    assert_nothing_left(sortie_home, cloud=cloud, name="none")
    assert fleet_status(sortie_home).sorties == []
    assert LocalBackend(tmp_path / "double-machines").cluster_ids() == []


@needs_sshd
def test_run_gpu_launches_the_cheapest_place_and_falls_back_to_the_next(
        cloud: DoubleCloud, work: Path, tmp_path: Path, sortie_home: Path,
        capsys: pytest.CaptureFixture[str]):
    """`sortie run --gpu A100:8`: the cheapest region first; without capacity there, the next
    one that is not excluded, priced as what it is."""
    sortie_home.mkdir(parents=True, exist_ok=True)
    (sortie_home / "config.yaml").write_text("exclude_regions: [aws:us-west-2]\n")
    cloud.region_capacity.update({"us-east-1": 0, "us-east-2": 0})  # no p4d to give
    runs = tmp_path / "runs"
    opened: list[DoubleStack] = []  # each site's stack, kept past its removal
    open_stack = cloud.open
    cloud.open = lambda name: opened.append(open_stack(name)) or opened[-1]  # type: ignore
    code, out, err = sortie(capsys, "run", "--gpu", "A100:8", "--interconnect", "efa",
                            "--nodes", "2", "-p", "1", "--workdir", str(work), "--script",
                            "job.py", "--name", "cheapest", "--runs-dir", str(runs), "--json",
                            "--set", "owner=ml-team")
    assert code == 0, err
    # --set goes on every site's profile, not only the first's: the one that launched is the
    # third (after two without capacity)
    launched = [stack.settings for stack in opened if stack.settings][-1]
    assert launched["sortie:region"] == "eu-central-1" and \
        launched["sortie:owner"] == "ml-team", launched
    # priced before launch at the cheapest place, with the fallbacks' worst said
    assert "aws-p4d: 2 x p4d.24xlarge in us-east-1, on-demand: estimated $43.92/h" in err
    assert "other places, up to $" in err
    failed = [line for line in err.splitlines() if "launch failed" in line]
    assert len(failed) == 2 and "aws us-east-1 p4d.24xlarge" in failed[0] and \
        "aws us-east-2 p4d.24xlarge" in failed[1] and "InsufficientInstanceCapacity" in err
    # us-west-2 is excluded: the next (Frankfurt) is priced at us-east-1's figure (AWS's dated
    # price list is us-east-1's: another region's is an estimate, and said to be)
    run = json.loads((runs / "cheapest" / "run.json").read_text())
    assert run["usd_per_hour"] == pytest.approx(2 * 21.95764, abs=0.01)
    assert run["profile"] == "aws-p4d"
    assert json.loads(out)["teardown"]["clean"]
    assert_nothing_left(sortie_home, cloud=cloud, name="cheapest")


def test_gpu_flags_are_checked_before_anything_starts(tmp_path: Path, sortie_home: Path,
                                                      capsys: pytest.CaptureFixture[str]):
    code, _, err = sortie(capsys, "up", "--spot")
    assert code == 2 and "--spot, --max-usd-per-hour, --interconnect: apply with --gpu" in err
    code, _, err = sortie(capsys, "run", "--gpu", "A100:8", "--stack", "aws-p4d")
    assert code == 2 and "--gpu: places the cluster itself; --stack does not apply" in err
    code, _, err = sortie(capsys, "run", "--gpu", "A100:8", "--set", "region=us-west-2")
    assert code == 2 and "--set region: --gpu chooses it" in err, err
    code, _, err = sortie(capsys, "up", "--gpu", "A100:3")
    assert code == 2 and "--gpu A100:3: the catalog's A100 machines have " in err, err
    code, _, err = sortie(capsys, "up", "--gpu", "A100:8", "--max-usd-per-hour", "1")
    assert code == 2 and "--gpu A100:8: no catalog machine fits these limits (see" in err, err
    sortie_home.mkdir(parents=True, exist_ok=True)
    (sortie_home / "config.yaml").write_text("exclude_regions: [Not A Region]\n")
    code, _, err = sortie(capsys, "plan", "--gpu", "A100:8")
    assert code == 2 and "config.yaml: exclude_regions: 'Not A Region' is not a region" in err
    (sortie_home / "config.yaml").write_text("gpu_profile: {aws: x}\n")
    code, _, err = sortie(capsys, "up", "--gpu", "A100:8")
    assert code == 2 and "config.yaml: gpu_profile: Extra inputs are not permitted" in err
    assert not (sortie_home / "stacks").exists(), "nothing was started"


@needs_sshd
def test_a_cloud_cluster_held_with_idle_stop_is_destroyed_once_its_nodes_power_off(
        cloud: DoubleCloud, sortie_home: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch):
    """`up --stack --idle-stop 10m`: every node carries its idle timer (the stack's config, from
    which the program renders it); once its nodes have powered themselves off, `reap` destroys
    the rest, and not before."""
    # Each reap below waits this long for nodes that are gone (10 s: 40 s of the test's 47 s,
    # waiting); how long it waits is not what this test is about.
    monkeypatch.setattr(reap, "PROBE_TIMEOUT_S", 3.0)
    code, _, err = sortie(capsys, "up", "--stack", "aws-p3-dev", "--idle-stop", "2m")
    assert code == 2 and "--idle-stop: a cloud cluster's is at least 5m" in err
    code, out, _ = sortie(capsys, "up", "--stack", "aws-p3-dev", "--nodes", "2", "--name",
                          "idler", "--idle-stop", "10m")
    assert code == 0, out
    assert cloud.stacks["idler"].settings["sortie:idleStopMinutes"] == 10
    code, out, _ = sortie(capsys, "status", "--json")
    row = next(r for r in json.loads(out)["sorties"] if r["name"] == "idler")
    assert "its nodes power off after 10m with nothing running" in row["detail"]

    cloud.backend(sortie_home)._update("idler", created=time.time() - 11 * 60)  # idle limit past
    code, out, _ = sortie(capsys, "reap")
    assert code == 0 and "idler" not in out, "its nodes still answer: left alone"
    # Third review: no node answering SSH *from here* (a changed address, a blip) destroyed a
    # cluster still at work. Unreachable but running, says the cloud: left alone.
    for node in ("node-0", "node-1"):
        cloud.local.reclaim("idler", node)  # unreachable from here; the machine still runs
    code, out, _ = sortie(capsys, "reap")
    assert code == 0 and "idler: no node answers SSH from here, but the cloud says 2 of its " \
        "machines still run: left as it is" in out, out
    assert "idler" in cloud.stacks
    cloud.cannot_ask = True  # and when the cloud cannot be asked, nothing is destroyed either
    code, out, _ = sortie(capsys, "reap")
    assert code == 1 and "its idle stop is not confirmed (cannot ask aws" in out, out
    cloud.cannot_ask = False
    for node in ("node-0", "node-1"):
        cloud.power_off("idler", node)  # each powered itself off: stopped, says the cloud
    code, out, _ = sortie(capsys, "reap", "--dry-run")
    assert code == 0 and "idler: idle-stopped (every machine stopped, says the cloud), would " \
        "be torn down" in out
    code, out, _ = sortie(capsys, "reap")
    assert code == 0, out
    assert "idler: idle-stopped" in out and "0 resources remain" in out
    assert_nothing_left(sortie_home, cloud=cloud, name="idler")
