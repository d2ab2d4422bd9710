"""The cloud path's orchestration (`PulumiBackend` + the one lifecycle) against an in-repo double
of the Pulumi stack whose machines are real local nodes: launch that fails half-way, retries per
the profile's policy, destroy failing once, preemption mid-run; and the real CLI path."""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path

import pytest

from sortie.core.errors import UsageError
from sortie.engine.launch import run_sortie
from sortie.engine.request import RunRequest
from sortie.stacks.backend import LaunchError
from sortie.stacks.cloud.automation import AutomationStacks
from sortie.stacks.records import Controller
from sortie.trainer.metrics import STEP_PATTERN
from tests.helpers import (
    Recorder,
    assert_nothing_left,
    loopback_listeners,
    needs_sshd,
    owned_listeners,
    processes_mentioning,
    sortie,
)
from tests.stack_double import BASE, MACHINE, DoubleCloud

pytestmark = pytest.mark.e2e


@needs_sshd
def test_launch_fails_half_way_then_next_zone_then_on_demand(tmp_path: Path):
    cloud = DoubleCloud(tmp_path)
    cloud.capacity = {("us-east-1a", True): 1, ("us-east-1b", True): 0}
    backend = cloud.backend(tmp_path, "zone=us-east-1a", "fallbackZones=[us-east-1b]")
    assert [p.describe() for p in backend.placements()] == [
        "zone us-east-1a", "zone us-east-1b", "zone us-east-1a, on-demand"]
    reporter = Recorder()
    before = loopback_listeners()
    result = run_sortie(RunRequest(nodes=2, procs_per_node=1, steps=10, run_id="half",
                                   runs_dir=tmp_path / "runs"), reporter, backend)
    assert result.trained, reporter.lines[-20:]
    assert result.launch_failures == [
        "attempt 1 (zone us-east-1a): pulumi up: error: creating EC2 Instance (node-1): "
        "InsufficientInstanceCapacity in us-east-1a",
        "attempt 2 (zone us-east-1b): pulumi up: error: creating EC2 Instance (node-0): "
        "InsufficientInstanceCapacity in us-east-1b"]
    assert sum("the partial cluster was removed" in n for n in reporter.notes) == 2
    assert result.teardown.clean and "0 resources remain" in result.teardown.summary()
    assert result.collect_error is None and result.collected
    assert owned_listeners(loopback_listeners() - before, tmp_path) == set()
    assert_nothing_left(tmp_path, cloud=cloud, name="half")


def test_without_a_zone_each_zone_offering_the_type_is_an_attempt(tmp_path: Path):
    cloud = DoubleCloud(tmp_path)
    cloud.offered_zones = ["us-east-1b", "us-east-1d"]
    backend = cloud.backend(tmp_path, "fallbackZones=[us-east-1d, us-east-1f]")
    assert [p.describe() for p in backend.placements()] == [
        "zone us-east-1b", "zone us-east-1d", "zone us-east-1f", "zone us-east-1b, on-demand"]

    def cannot_ask(spec):
        raise RuntimeError("no credentials")

    backend.zones = cannot_ask  # the program then picks, and says so if it cannot
    assert [p.describe() for p in backend.placements()] == [
        "default placement", "zone us-east-1d", "zone us-east-1f", "on-demand"]
    cloud.offered_zones = []
    assert [p.describe() for p in cloud.backend(tmp_path).placements()] == [
        "default placement", "on-demand"]


@needs_sshd
def test_no_placement_left_is_one_clear_failure_with_nothing_left(tmp_path: Path):
    cloud = DoubleCloud(tmp_path)
    cloud.capacity = {("us-east-1a", True): 0, ("us-east-1a", False): 1}
    backend = cloud.backend(tmp_path, "zone=us-east-1a")
    with pytest.raises(LaunchError, match=r"no launch attempt brought up all 2 nodes: attempt 1 "
                       r"\(zone us-east-1a\): .*; attempt 2 \(zone us-east-1a, on-demand\): "):
        run_sortie(RunRequest(nodes=2, procs_per_node=1, steps=5, run_id="none",
                              runs_dir=tmp_path / "runs"), Recorder(), backend)
    assert_nothing_left(tmp_path, cloud=cloud, name="none")


@needs_sshd
def test_destroy_failing_once_is_retried(tmp_path: Path):
    cloud = DoubleCloud(tmp_path)
    cloud.fail_destroys = 1
    backend = cloud.backend(tmp_path)
    inventory = backend.up("twice", 2)
    assert [n.name for n in inventory.nodes] == ["node-0", "node-1"]
    stack = cloud.stacks["twice"]
    report = backend.down("twice")
    assert stack.calls.count("destroy") == 2 and stack.removed
    assert report.clean and report.removed == len(inventory.nodes) + len(BASE)
    assert report.summary() == "twice: removed 9 resources; 0 resources remain"
    assert_nothing_left(tmp_path, cloud=cloud, name="twice")


@needs_sshd
def test_nodes_are_found_and_replaced_by_their_node_subtree(tmp_path: Path):
    """A machine gone from the refreshed stack is lost; a lost machine that still exists (SSH
    dead, noticed) is replaced by the URN of the machine under its Node component: the double
    refuses any other URN, as Pulumi does."""
    cloud = DoubleCloud(tmp_path)
    backend = cloud.backend(tmp_path)
    inventory = backend.up("nodes", 3)
    stack = cloud.stacks["nodes"]
    assert backend.lost_nodes(inventory).nodes == []
    cloud.reclaim("nodes", "node-2")
    assert backend.lost_nodes(inventory).nodes == ["node-2"]
    old_key = inventory.nodes[1].host_key
    replaced = backend.replace(inventory, ["node-1", "node-2"])
    assert stack.calls[-1] == "up replace=1", "node-1 replaced explicitly, node-2 re-created"
    assert replaced.nodes[1].host_key != old_key
    assert backend.lost_nodes(replaced).nodes == []
    assert backend.down("nodes").clean
    assert_nothing_left(tmp_path, cloud=cloud, name="nodes")


@needs_sshd
def test_destroy_that_keeps_failing_lists_what_remains(tmp_path: Path):
    cloud = DoubleCloud(tmp_path)
    backend = cloud.backend(tmp_path)
    backend.up("stuck", 1)
    cloud.fail_destroys = 3
    report = backend.down("stuck")
    assert not report.clean
    text = report.summary()
    assert text.startswith("teardown of stuck incomplete") and "aws:ec2/vpc:Vpc" in text
    assert "retry with `sortie down stuck`" in text
    assert "stuck" in cloud.stacks, "the stack stays until its resources are gone"
    assert backend.down("stuck").clean  # the next try succeeds
    assert_nothing_left(tmp_path, cloud=cloud, name="stuck")


@needs_sshd
def test_unverified_artifacts_keep_the_bucket_in_the_stack(tmp_path: Path):
    """`down(keep_bucket=True)`: one targeted destroy of everything but the bucket and what it
    needs (the double refuses a target set that leaves a dependent behind, as Pulumi does)."""
    cloud = DoubleCloud(tmp_path)
    backend = cloud.backend(tmp_path)
    backend.up("keep", 2)
    report = backend.down("keep", keep_bucket=True)
    assert report.clean, report.summary()
    assert report.kept == ["the bucket (2 resources) in stack keep; `sortie down keep` removes it"]
    assert sorted(cloud.resources.values()) == ["aws:s3/bucket:Bucket",
                                                "aws:s3/bucketPolicy:BucketPolicy"]
    assert "keep" in cloud.stacks and (tmp_path / "stacks" / "keep").is_dir()
    assert processes_mentioning(tmp_path / "double-machines") == [], "the machines are gone"
    later = backend.down("keep")
    assert later.clean and later.removed == 2 and later.kept == []
    assert_nothing_left(tmp_path, cloud=cloud, name="keep")


def test_kept_resources_include_what_they_depend_on():
    from sortie.stacks.cloud.stack_api import StackResource
    from sortie.stacks.cloud.teardown import with_dependencies

    grant = StackResource("urn:grant", "gcp:storage/bucketIAMMember:BucketIAMMember",
                          ("urn:bucket", "urn:account"))
    bucket = StackResource("urn:bucket", "gcp:storage/bucket:Bucket")
    settings = StackResource("urn:settings", "aws:s3/bucketPolicy:BucketPolicy",
                             ("urn:bucket", "urn:account"))
    account = StackResource("urn:account", "gcp:serviceaccount/account:Account")
    machine = StackResource("urn:machine", MACHINE, ("urn:account",))
    everything = [grant, bucket, settings, account, machine]
    assert with_dependencies(everything, [bucket]) == [bucket]
    assert with_dependencies(everything, [bucket, settings]) == [bucket, settings, account]


def expire(cloud: DoubleCloud, name: str) -> None:
    """Time passes: the sortie's TTL runs out (its record in the shared backend says when)."""
    cloud.update_record(name, expires_at=time.time() - 60)


@needs_sshd
def test_reap_finds_expired_stacks_in_the_backend_whichever_controller_launched_them(
        tmp_path: Path):
    """Controller A launches two sorties and dies with its state; controller B, sharing only the
    state backend, reaps the one past its TTL from the record beside Pulumi's state and leaves
    the other."""
    from sortie.engine.reap import reap
    from sortie.fleet import registry
    from sortie.stacks.cloud.access import CloudAccess

    cloud = DoubleCloud(tmp_path)
    controller_a, controller_b = tmp_path / "controller-a", tmp_path / "controller-b"
    launched = time.time()
    cloud.backend(controller_a, "ttlHours=1").up("short", 1)
    cloud.backend(controller_a, "ttlHours=24").up("long", 1)
    shutil.rmtree(controller_a)  # A is gone, and what it knew with it
    for name in ("short", "long"):  # A ran on another machine; its heartbeat stopped 10 min ago
        cloud.update_record(name, controller=Controller(
            host="laptop-a", pid=4242, started=launched, heartbeat=time.time() - 600))
    access = CloudAccess(stacks=cloud, sweep=cloud.sweep)
    rows = {seen.row.name: seen.row for seen in registry.survey(controller_b, access,
                                                                      elsewhere=True)}
    short, long = rows["short"], rows["long"]
    assert (short.backend, short.nodes, short.source) == ("aws", 1, "state backend")
    assert abs(short.age_s) < 120 and short.ttl_left_s > 3000 and long.ttl_left_s > 80000
    assert short.state == "orphaned", "A's heartbeat is stale: its controller is gone"
    assert cloud.records.load("short").config["sortie:ttlHours"] == 1
    assert abs(cloud.records.load("short").created - launched) < 120
    expire(cloud, "short")
    [reaped, still] = sorted(reap(controller_b, access), key=lambda r: r.name != "short")
    assert reaped.action == "torn down" and reaped.teardown.clean, reaped.line
    assert "short" not in cloud.stacks and not any("::short-" in urn for urn in cloud.resources)
    assert cloud.records.load("short") is None
    assert still.action == "torn down"  # orphaned (A died) and nothing was trained on it
    assert cloud.resources == {}


@needs_sshd
def test_preemption_mid_run_is_recovered_through_the_stack(tmp_path: Path):
    cloud = DoubleCloud(tmp_path)
    backend = cloud.backend(tmp_path)
    taken: list[str] = []
    stacks: list = []  # the sortie's stack (a stack opened before the launch takes its name)

    def reclaim_at_step_20(node: str, line: str) -> None:
        step = re.search(r"step\s+(\d+)/80", line)
        if not taken and step and int(step.group(1)) >= 20:
            taken.append(node)
            stacks.append(cloud.stacks["pre"])
            cloud.reclaim("pre", "node-1")

    reporter = Recorder(reclaim_at_step_20)
    result = run_sortie(RunRequest(nodes=2, procs_per_node=1, steps=80, ckpt_every=10,
                                   run_id="pre", runs_dir=tmp_path / "runs",
                                   trainer_args=("--log-every", "5")), reporter, backend)
    assert taken, "training never reached step 20"
    assert result.trained, reporter.lines[-30:]
    [recovery] = result.recoveries
    assert recovery.lost == ["node-1"] and recovery.reason == "machine gone"
    assert recovery.resumed_from_step is not None and recovery.resumed_from_step >= 10
    assert recovery.cost_s > 0
    assert result.summary["steps"] == 80 and result.summary["resumed_from"] > 0
    assert any(note.startswith("recovery 1: replaced node-1") for note in reporter.notes)
    # Through the stack: a refresh found the machine gone and a second `up` re-created it.
    assert stacks[0].calls[:3] == ["up", "refresh", "up"], stacks[0].calls
    assert result.teardown.clean
    assert_nothing_left(tmp_path, cloud=cloud, name="pre")


def test_bad_profile_fails_before_any_stack(tmp_path: Path):
    cloud = DoubleCloud(tmp_path)
    with pytest.raises(UsageError, match=r"^sortie:fallbackZones: us-west-2a cannot host"):
        cloud.backend(tmp_path, "fallbackZones=[us-west-2a]")
    assert cloud.stacks == {}


def test_listing_a_shared_backend_without_pulumi_is_one_line(tmp_path: Path):
    env = {"PATH": "/usr/bin:/bin", "SORTIE_HOME": str(tmp_path / "sortie-home")}
    result = sortie("reap", "--backend-url", "s3://team-pulumi-state", cwd=tmp_path, env=env)
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "sortie: error: --backend-url: listing stacks needs the Pulumi CLI, which is not on PATH "
        "(install it: https://www.pulumi.com/docs/install/)")
    listing = sortie("status", "--backend-url", "s3://team-pulumi-state", cwd=tmp_path, env=env)
    assert listing.returncode == 2 and listing.stderr == result.stderr
    quiet = sortie("reap", cwd=tmp_path, env=env)  # no backend of its own: nothing to do
    assert quiet.returncode == 0 and quiet.stdout == quiet.stderr == ""


@pytest.mark.parametrize("command", ["run", "up"])
def test_run_stack_without_pulumi_or_credentials_is_one_line(tmp_path: Path, command: str,
                                                             own_profiles: Path):
    home = tmp_path / "home"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "AWS_CONFIG_FILE": str(home / "none"),
           "AWS_SHARED_CREDENTIALS_FILE": str(home / "none"), "AWS_EC2_METADATA_DISABLED": "true",
           "AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": "", "AWS_PROFILE": "",
           "SORTIE_HOME": str(tmp_path / "sortie-home")}
    result = sortie(command, "--stack", "aws-p4d", cwd=tmp_path, env=env)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("sortie: error: cannot run stack aws-p4d: the Pulumi CLI is "
                               "not on PATH"), lines[0]
    assert "no AWS credentials" in lines[0] and "nothing was created" in lines[0]
    assert not (tmp_path / "sortie-home" / "stacks").exists()


@pytest.mark.skipif(shutil.which("pulumi") is None,
                    reason="the Pulumi CLI is not on PATH (it is not in any registry here); "
                           "this runs the real Automation API path where it is installed")
def test_real_pulumi_cli_creates_lists_and_removes_a_stack(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("PULUMI_CONFIG_PASSPHRASE", raising=False)
    stacks = AutomationStacks(tmp_path)
    stack = stacks.open("sortie-cli-check")
    assert "sortie-cli-check" in stacks.names()
    assert [r for r in stack.resources() if r.is_cloud_resource] == []
    assert stack.config() == {}  # a stack `up` never ran on: not a sortie, never reaped
    from sortie.fleet import registry
    from sortie.stacks.cloud.access import CloudAccess

    access = CloudAccess(stacks=stacks)
    # no record, no expiry: not a sortie
    assert registry.survey(tmp_path, access, elsewhere=True) == []
    stack.remove()
    assert "sortie-cli-check" not in stacks.names()
    assert (tmp_path / "pulumi" / "passphrase").stat().st_mode & 0o077 == 0


@needs_sshd
def test_a_cloud_preemption_notice_becomes_a_checkpoint_and_a_recovery(tmp_path: Path,
                                                                        metadata: str):
    """The nodes know their cloud from the stack outputs and the trainer polls its notice by
    default. Before: nothing passed --preemption-notice, and a spot node's warning was wasted:
    training ran on until the machine vanished, losing everything since the last checkpoint."""
    from tests.helpers import CloudMetadata

    cloud = DoubleCloud(tmp_path)
    cloud.metadata_url = metadata
    backend = cloud.backend(tmp_path)
    noticed: list[int] = []
    preempted_at: list[int] = []

    def the_cloud(node: str, line: str) -> None:
        step = STEP_PATTERN.search(line)
        if not noticed and step and int(step.group(1)) >= 10:
            noticed.append(int(step.group(1)))
            CloudMetadata.preempted = True  # the notice: this spot machine goes in 2 minutes
        # Rank 0 says "preempted (aws preemption notice)", with "(another rank)" after it when
        # another rank's poll saw the notice first: every rank stops at the same step either way.
        if (match := re.search(r"trainer: preempted \(.*\) at step (\d+)", line)) \
                and CloudMetadata.preempted:
            CloudMetadata.preempted = False
            preempted_at.append(int(match.group(1)))
            cloud.reclaim("notice", "node-1")  # ... and it goes

    reporter = Recorder(the_cloud)
    result = run_sortie(RunRequest(nodes=2, procs_per_node=1, steps=200, ckpt_every=150,
                                   run_id="notice", runs_dir=tmp_path / "runs",
                                   trainer_args=("--log-every", "5")), reporter, backend)
    assert noticed and preempted_at and result.trained, result.exit_codes
    assert len(result.recoveries) == 1, "\n".join(reporter.notes + [
        line for line in reporter.lines if "preempt" in line or "resumed" in line])
    [recovery] = result.recoveries
    assert recovery.lost == ["node-1"]
    # It resumed from the checkpoint the notice made (not from the periodic one, or step 0).
    assert recovery.resumed_from_step == preempted_at[0] >= noticed[0], recovery.line()
    assert preempted_at[0] % 150, "the notice came at a periodic checkpoint: proves nothing"
    assert result.teardown.clean
    assert_nothing_left(tmp_path, cloud=cloud, name="notice")


# Each cloud's own words (its API's error text as Pulumi's provider prints it).
NOT_CAPACITY = {
    "quota": "creating EC2 Instance: operation error EC2: RunInstances, https response error "
             "StatusCode: 400, api error VcpuLimitExceeded: You have requested more vCPU "
             "capacity than your current vCPU limit of 0 allows",
    "permission": "creating EC2 Instance: api error UnauthorizedOperation: You are not "
                  "authorized to perform this operation. User: arn:aws:iam::1:user/dev is not "
                  "authorized to perform: ec2:RunInstances",
    "image": "creating EC2 Instance: api error InvalidAMIID.NotFound: The image id "
             "'[ami-0123456789abcdef0]' does not exist",
}


@pytest.mark.parametrize("kind", sorted(NOT_CAPACITY))
def test_a_quota_permission_or_image_error_stops_the_launch_at_once(tmp_path: Path, kind: str):
    """Only capacity moves a launch on (issue 64): before, each of these was tried in every
    zone and then on demand, each try making and destroying the network."""
    cloud = DoubleCloud(tmp_path)
    cloud.offered_zones = ["us-east-1a", "us-east-1b", "us-east-1c"]
    cloud.launch_errors = [NOT_CAPACITY[kind]] * 4
    backend = cloud.backend(tmp_path, "spotFallbackOnDemand=true")
    assert len(backend.placements()) == 4
    reporter = Recorder()
    with pytest.raises(LaunchError) as raised:
        run_sortie(RunRequest(nodes=2, procs_per_node=1, steps=5, run_id="stop",
                              runs_dir=tmp_path / "runs"), reporter, backend)
    said = str(raised.value)
    assert len(cloud.launch_errors) == 3, "one attempt, not one per zone"
    assert said.startswith(f"launch stopped: attempt 1 (zone us-east-1a): {kind} (")
    assert "\n" not in said and NOT_CAPACITY[kind] in said
    if kind == "quota":
        assert "VcpuLimitExceeded" in said and "Service Quotas" in said
    assert_nothing_left(tmp_path, cloud=cloud, name="stop")

