"""What the Slurm backend reads (Slurm's times and messages, a recorded allocation) and what it is
given (--slurm's flags, partition prices), checked in-process."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from sortie.cli.app import main
from sortie.cli.slurm_options import partition_prices, slurm_request
from sortie.core.errors import UsageError
from sortie.core.inventory import Node, SrunRoute
from sortie.stacks.slurm import slurm_queue as queue
from sortie.stacks.slurm.slurm_backend import SlurmBackend
from sortie.stacks.slurm.slurm_queue import signal_lead_s
from sortie.stacks.slurm.slurm_sites import SlurmAsk, SlurmSite

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(("text", "seconds"), [
    ("90", 5400), ("2", 120), ("1:30", 90), ("2:00:00", 7200), ("1-0", 86400),
    ("1-2", 93600), ("1-2:30", 95400), ("1-2:30:05", 95405), ("x", 0), ("1:2:3:4", 0),
])
def test_time_limits_read_as_sbatch_reads_them(text: str, seconds: int) -> None:
    assert queue.time_limit_s(text) == seconds


@pytest.mark.parametrize(("shown", "seconds"), [
    ("59", 59), ("1:55", 115), ("2:00:00", 7200), ("1-00:00:10", 86410),
    ("UNLIMITED", None), ("INVALID", None), ("", None), ("1:2:3:4", None),
])
def test_time_left_as_squeue_shows_it(shown: str, seconds: int | None) -> None:
    assert queue.slurm_seconds(shown) == seconds


def test_the_signal_comes_a_quarter_of_the_limit_before_at_most_90_s() -> None:
    assert signal_lead_s("2") == 30 and signal_lead_s("4:00:00") == 90
    assert signal_lead_s("0:20") == 10  # never less than 10 s


@pytest.mark.parametrize(("message", "flag"), [
    ("invalid partition specified: gpu", "--partition"),
    ("Job's account not known, so it can't use this partition (lab allows physics)",
     "--account"),
    ("Invalid qos specification", "--qos"),
    ("Requested time limit is invalid (missing or exceeds some limit)", "--time"),
    ("Requested node configuration is not available", "--nodes"),
    ("Invalid generic resource (gres) specification", "--gpus-per-node"),
    ("Requested reservation is invalid", "--reservation"),
    ("Invalid feature specification", "--constraint"),
    ("Memory specification can not be satisfied", "--mem"),
    ("something else", "--slurm"),
])
def test_slurms_refusal_names_the_flag(message: str, flag: str) -> None:
    assert queue.flag_of(message) == flag


def test_the_slurm_flags_are_checked_in_one_line() -> None:
    assert slurm_request(None, None, 0, None, None, None) is None
    with pytest.raises(UsageError, match="apply with --slurm"):
        slurm_request(None, "gpu", 0, None, None, None)
    with pytest.raises(UsageError, match="apply with --slurm"):
        slurm_request(None, None, 0, None, None, None, exclusive=True)
    with pytest.raises(UsageError, match="--partition: 'a b' is not as Slurm writes it"):
        slurm_request("hpc", "a b", 0, None, None, None)
    with pytest.raises(UsageError, match="--time: '2h'"):
        slurm_request("hpc", None, 0, "2h", None, None)
    with pytest.raises(UsageError, match=r"--mem: '2 GB' is not as Slurm writes it \(64G"):
        slurm_request("hpc", None, 0, None, None, None, mem="2 GB")
    asked = slurm_request("hpc", "gpu", 8, "4:00:00", "lab", "high")
    assert asked.ask.options(2) == ["--nodes=2", "--ntasks-per-node=1", "--gres=gpu:8",
                                    "--partition=gpu", "--time=4:00:00", "--account=lab",
                                    "--qos=high"]


def test_an_allocation_is_shaped_as_sites_need_and_sbatch_args_pass_unless_they_fight():
    """Issue 67 (3): no way to shape the allocation (memory, CPUs, whole nodes, features, a
    reservation, nodes to avoid, several partitions), nor to pass sbatch an option of its
    own; each is a flag now, and `--sbatch-arg` passes the rest, refusing what sortie sets."""
    asked = slurm_request("hpc", "gpu,debug", 0, None, None, None, mem="64G", cpus_per_task=9,
                          exclusive=True, constraint="a100&ib", reservation="maint",
                          exclude="n[3-4]", sbatch_args=("--comment=exp7", "--mail-type=END"))
    assert asked.ask.options(2) == [
        "--nodes=2", "--ntasks-per-node=1", "--cpus-per-task=9", "--exclusive",
        "--partition=gpu,debug", "--mem=64G", "--constraint=a100&ib", "--reservation=maint",
        "--exclude=n[3-4]", "--comment=exp7", "--mail-type=END"]
    for arg, said in (("--ntasks=4", "--ntasks: sortie sets it itself"),
                      ("-N 2", "give one of sbatch's long options"),
                      ("--mem=1G", "--mem: sortie has a flag for it, --mem"),
                      ("--output=/tmp/x", "--output: sortie sets it itself"),
                      ("--comment=$(reboot)", "give one of sbatch's long options")):
        with pytest.raises(UsageError, match=re.escape(said)):
            slurm_request("hpc", None, 0, None, None, None, sbatch_args=(arg,))


def test_partition_prices_are_checked() -> None:
    assert partition_prices(("gpu=2.5", "default=0")) == {"gpu": 2.5, "default": 0.0}
    for bad in ("gpu", "gpu=-1", "gpu=nan", "a b=1", "gpu=x"):
        with pytest.raises(UsageError, match="--usd-per-gpu-hour"):
            partition_prices((bad,))


def test_an_allocation_is_priced_in_gpu_hours_at_its_partitions_rate(tmp_path: Path) -> None:
    site = SlurmSite(name="hpc", shared_dir=str(tmp_path), usd_per_gpu_hour={"gpu": 2.5},
                     attached_at=0)
    priced = SlurmBackend(tmp_path, site, SlurmAsk("gpu", gpus_per_node=8))
    price = priced.notional_price(2)
    assert price is not None and price.usd_per_hour == 2 * 8 * 2.5
    assert "$2.5 per GPU-hour (gpu" in price.terms and priced.price_note(2) is None
    unpriced = SlurmBackend(tmp_path, site, SlurmAsk("cpu"))
    assert unpriced.notional_price(2) is None
    assert "no $ per GPU-hour for partition cpu of hpc: counted at $0" in unpriced.price_note(2)


def test_a_node_needs_a_pinned_key_unless_slurm_reaches_it() -> None:
    common = {"name": "node-0", "address": "n1", "port": 22, "user": "me", "gpus": 0,
              "private_address": "10.0.0.1", "workdir": "/shared/sortie-x"}
    with pytest.raises(ValidationError, match="needs key_path and its pinned host_key"):
        Node(**common)
    Node(**common, srun=SrunRoute(job_id="12", host="n1"))
    with pytest.raises(ValidationError):
        SrunRoute(job_id="12; rm -rf /", host="n1")
    with pytest.raises(ValidationError):
        SrunRoute(job_id="12", host="-oProxyCommand")


def test_slurm_flags_without_slurm_are_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("SORTIE_HOME", str(tmp_path))
    assert main(["run", "--partition", "gpu"]) == 2
    said = capsys.readouterr().err.strip()
    assert said.startswith("sortie: error: --partition") and "apply with --slurm" in said
    assert "\n" not in said


def test_a_held_allocations_budget_is_its_time_limit(tmp_path: Path) -> None:
    """Fourth review (issue 61), Medium 8: `up --slurm --max-cost 5` was accepted and never
    enforced ($148 spent in 76 s): a held allocation has no controller to stop it. Its time
    limit is cut to what the budget buys at its price (never lengthened); a run's is left to
    its controller (a time limit there means checkpoint and resume elsewhere)."""
    site = SlurmSite(name="lab", shared_dir="/s", usd_per_gpu_hour={"debug": 3.0},
                     attached_at=0)

    def held(time: str | None, max_usd: float, held: bool = True) -> str | None:
        backend = SlurmBackend(tmp_path, site, SlurmAsk("debug", 2, time))
        budgeted = backend.capped(max_usd, 2, held=held)  # 4 GPUs at $3: $12 an hour
        assert backend.ask.time == time, "the backend asked is left as it was"
        return budgeted.ask.time

    assert held(None, 5.0) == "24"  # 25 minutes, less the wind-down, in whole minutes
    assert held("2:00:00", 5.0) == "24"
    assert held("10", 5.0) == "10"
    assert held(None, 5.0, held=False) is None
    assert "--time=24" in SlurmBackend(tmp_path, site, SlurmAsk("debug", 2, "24")).ask.options(2)
    with pytest.raises(UsageError, match=r"^--max-cost: \$0.1 buys under a minute"):
        held(None, 0.1)
    unpriced = SlurmBackend(tmp_path, site, SlurmAsk("debug", 0, None))
    # counted at $0: it never spends the budget
    assert unpriced.capped(5.0, 2, held=True).ask.time is None


def test_odd_accounting_is_skipped_not_a_traceback() -> None:
    """Fourth review (issue 61), Low 11: `5||7`, `²`, 400 nines and 1e15 in sacct's answer
    crashed `down`, and its cost line was lost. Such lines are skipped."""
    shown = "\n".join(["5||7", "6|COMPLETED|²", f"7|COMPLETED|{'9' * 400}", "8|FAILED|1e15",
                       "9|COMPLETED by 0|42", "10|RUNNING|8", "11|PENDING"])
    assert queue.accounting_rows(shown) == [("COMPLETED", 42), ("RUNNING", 8)]


def test_a_damaged_allocation_record_never_advises_cancelling_by_name(tmp_path: Path) -> None:
    """Fourth review (issue 61), Low 12: the advice `scancel --name sortie-NAME` cancels every
    allocation of that name this user has, another home's included. It names the way to find
    this one's job id instead."""
    backend = SlurmBackend(tmp_path)
    state = backend.state_dir("dev")
    state.mkdir(parents=True)
    (state / "allocation.json").write_text("{not json")
    report = backend.down("dev")
    [left] = report.leftovers
    assert "scancel --name" not in left.remove and "squeue --me --name sortie-dev" in left.remove


def test_an_attached_slurm_cluster_is_a_row_and_detached_only_when_no_allocation_needs_it(
        tmp_path: Path) -> None:
    """Issue 66: a Slurm cluster attached to allocate on is found by NAME and listed (its
    record read as untrusted: a damaged one is a broken row `down` still forgets); `down` is
    refused while an allocation of this controller names it."""
    from sortie.fleet import registry
    from sortie.stacks.slurm.slurm_backend import ALLOCATION_FILE, ALLOCATIONS

    for name in ("hpc", "bad"):
        (tmp_path / "slurm" / name).mkdir(parents=True)
    site = SlurmSite(name="hpc", shared_dir="/scratch", attached_at=0)
    (tmp_path / "slurm" / "hpc" / "site.json").write_text(site.model_dump_json())
    (tmp_path / "slurm" / "bad" / "site.json").write_text("{not json")
    (tmp_path / ALLOCATIONS / "dev").mkdir(parents=True)
    (tmp_path / ALLOCATIONS / "dev" / ALLOCATION_FILE).write_text(
        '{"site": "hpc", "job_id": "7", "workdir": "/scratch/sortie-dev/job", "ask": {}, '
        '"started": 0}')
    seen = registry.find(tmp_path, "hpc")
    assert (seen.kind, seen.row.state, seen.row.backend) == ("slurm-site", "attached", "slurm")
    assert seen.row.detail is not None and seen.row.detail.endswith("allocations on it: dev")
    assert registry.find(tmp_path, "bad").row.state == "broken"
    refused = registry.teardown(tmp_path, seen)
    assert not refused.clean and "`sortie down dev` first" in refused.summary()
    assert (tmp_path / "slurm" / "hpc" / "site.json").is_file()
    (tmp_path / ALLOCATIONS / "dev" / ALLOCATION_FILE).unlink()
    gone = registry.teardown(tmp_path, registry.find(tmp_path, "hpc"))
    assert gone.clean and gone.summary() == ("hpc: detached: its record is forgotten; nothing on "
                                             "the Slurm cluster was touched")
    assert not (tmp_path / "slurm" / "hpc").exists()
    assert registry.teardown(tmp_path, registry.find(tmp_path, "bad")).clean


def test_a_copy_on_this_machine_is_said_as_sent():
    """Issue 67 (8): on a Slurm login node (the shared disk is here, rsync copies locally) the
    sync line said "workdir unchanged" when files were sent: a local copy itemizes `>f`, not
    `<f`."""
    from sortie.bootstrap.sync import Sent, describe_sync

    local = ">f+++++++++\t12\ttrain.py\n>f.st......\t3\tnew.txt\n.d..t......\t4096\t./\n"
    assert Sent.from_changes(local) == Sent(files=2, bytes=15)
    assert describe_sync({"node-0": Sent.from_changes(local)}, ["node-0"]) == [
        "workdir: sent 2 files (15 B): new.txt, train.py on node-0"]


def test_a_nodes_ports_are_read_whether_or_not_its_interface_was_found() -> None:
    """A node where no interface holds its address still says which ports listen there: the
    rendezvous port must skip them either way. Its CPUs are read where Slurm said them."""
    from sortie.stacks.slurm.slurm_network import NodeFacts, read_node_facts

    listening = "0.0.0.0:22\n127.0.0.1:29501\n[::]:6818\n"
    assert read_node_facts(f"3\neth-n1\n{listening}") == NodeFacts(
        "eth-n1", frozenset({22, 29501, 6818}), 3)
    assert read_node_facts(f"\n\n{listening}") == NodeFacts("", frozenset({22, 29501, 6818}))
    assert read_node_facts("2; rm -rf /\neth0; rm -rf /\n") == NodeFacts()
    assert read_node_facts("0\n\n").cpus is None and read_node_facts("999999\n").cpus is None


def test_a_step_asks_for_the_allocations_cpus_on_its_node_where_they_were_read() -> None:
    """At a site that binds each task to its cores (task/affinity), a step that asks for no
    CPUs gets one: torchrun and every rank shared it. `--cpu-bind=none` is not the answer: at
    a site that binds nothing, srun prints an error line into every step's output."""
    from sortie.bootstrap.srun import step_command

    read = step_command(SrunRoute(job_id="7", host="n1", cpus=3), "true")
    assert "--cpus-per-task=3" in read and read[-3:] == ["bash", "-c", "true"]
    assert not [arg for arg in step_command(SrunRoute(job_id="7", host="n1"), "true")
                if arg.startswith(("--cpus", "--cpu-bind"))]
    with pytest.raises(ValidationError):
        SrunRoute(job_id="7", host="n1", cpus=0)


def test_a_step_slurm_ended_is_said_in_slurms_words_for_the_latest_launch_only() -> None:
    """Issue 67 (3): what srun printed when Slurm ended the step (22.05's own lines), read
    after the latest launch's mark: an earlier attempt's kill is not this one's."""
    from sortie.bootstrap.srun import LAUNCH_MARK, slurm_ending

    memory = ("slurmstepd-n1: error: StepId=2.0 exceeded memory limit (587055104 > 314572800), "
              "being killed\nslurmstepd-n1: error: *** STEP 2.0 ON n1 CANCELLED AT "
              "2026-11-29T08:02:25 ***\n")
    assert slurm_ending(f"{LAUNCH_MARK}\n{memory}") == (
        "Slurm killed its step: it used 560 MiB of memory, over the 300 MiB the allocation "
        "holds (--mem)")
    assert slurm_ending(f"{LAUNCH_MARK}\n{memory}{LAUNCH_MARK}\n") is None
    timed = "slurmstepd-n2: error: *** STEP 7.3 ON n2 CANCELLED AT 2026-11-29T09:00:00 DUE TO " \
        "TIME LIMIT ***\n"
    assert slurm_ending(LAUNCH_MARK + "\n" + timed) == \
        "Slurm cancelled its step: the allocation's time limit (--time)"
    assert slurm_ending("srun: error: n1: task 0: Exited with exit code 1\n") is None


def test_cpus_default_to_the_ranks_and_the_agent_within_the_smallest_node() -> None:
    """Issue 67 (3): without --cpus-per-task a site gave each node one CPU (and, counting memory
    per CPU, too little memory for two ranks)."""
    assert SlurmAsk().with_cpus_for(2, 8).cpus_per_task == 3
    assert SlurmAsk().with_cpus_for(4, 2).cpus_per_task == 2  # the partition's smallest node
    assert SlurmAsk().with_cpus_for(2, None).cpus_per_task == 3
    assert SlurmAsk(cpus_per_task=1).with_cpus_for(2, 8).cpus_per_task == 1  # as asked
    assert SlurmAsk().with_cpus_for(0, 8).cpus_per_task == 0  # `up`: Slurm's own default
    assert "--cpus-per-task=3" in SlurmAsk().with_cpus_for(2, 8).options(2)


def test_a_detached_runs_controller_is_the_same_run_named_without_detach() -> None:
    """Issue 67 (6): the batch job of `run --detach` is that `sortie run`, less --detach, named
    (before a `--`: what follows is the job's), where it was submitted from."""
    import shlex
    import sys

    from sortie.engine.detach import controller_argv
    from sortie.stacks.slurm.detached_run import controller_script

    argv = controller_argv(["run", "--slurm", "lab", "--detach", "t.yaml", "--", "--detach"],
                           "away")
    assert argv == [sys.executable, "-m", "sortie", "run", "--slurm", "lab", "t.yaml",
                    "--name", "away", "--", "--detach"]
    script = controller_script(argv, Path("/home/a b"), Path("/home/a b/.sortie"))
    assert script.splitlines() == [
        "export SORTIE_IN_ALLOCATION=\"$SLURM_JOB_ID\" SORTIE_HOME='/home/a b/.sortie'",
        "cd '/home/a b' || exit 1", f"exec {shlex.join(argv)}"]


def test_detach_without_slurm_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("SORTIE_HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    assert main(["run", "--detach", "--nodes", "1"]) == 2
    assert capsys.readouterr().err.strip() == (
        "sortie: error: --detach: hands the run to a Slurm allocation (its controller runs in "
        "it): add --slurm NAME")


def test_a_queued_allocation_outlasts_its_controllers_missed_polls_before_ending_itself() -> None:
    """The orphan test makes the controller's mark old instead of waiting (issue 63): the wait it
    stands for is this one. A controller that is alive touches the mark at least every
    POLL_MAX_S; the allocation ends itself only after several of those went missed."""
    from sortie.stacks.slurm.hold_script import HOLD_SCRIPT, ORPHAN_AFTER_S, WAITING

    assert ORPHAN_AFTER_S >= 4 * queue.POLL_MAX_S
    assert f"-gt {ORPHAN_AFTER_S} ]" in HOLD_SCRIPT and f"stat -c %Y {WAITING}" in HOLD_SCRIPT


def test_the_lab_users_view_opens_every_way_down_a_closed_directory_once(tmp_path: Path):
    """Root's home holds this Python (`/root/.pyenv`) and the lab's files (`/root/.sortie`):
    both ways down are bound back under the one cover (before: one entry a directory, so the
    lab's daemons saw no files of their own)."""
    from sortie.stacks.slurm.lab_view import closed_ways, view_script

    closed = tmp_path / "root"
    for entry in (".pyenv/bin", ".sortie/slurm-lab"):
        (closed / entry).mkdir(parents=True)
    closed.chmod(0o700)
    (closed / ".sortie" / "slurm-lab").chmod(0o700)
    elsewhere = tmp_path / "other-lab"
    elsewhere.mkdir(mode=0o700)
    ways = closed_ways([closed / ".pyenv" / "bin", closed / ".pyenv" / "bin"],
                       kept=[closed / ".sortie" / "slurm-lab" / "log", elsewhere / "log"])
    assert dict(ways)[closed] == [".pyenv", ".sortie"]  # (and pytest's own closed parents)
    # Only a covered directory's way down is kept: nothing is covered for a kept path's sake
    # (covered, a directory shows nothing else: the lab's users would lose their files there).
    assert closed / ".sortie" / "slurm-lab" not in dict(ways) and elsewhere not in dict(ways)
    index = [directory for directory, _ in ways].index(closed)
    script = view_script(ways, tmp_path / "staging").splitlines()
    cover = script.index(f"mount -t tmpfs -o mode=0711 sortie-lab-view {closed}")
    binds_back = [line for line in script[cover:] if line.startswith("mount --bind")]
    assert binds_back == [f"mount --bind {tmp_path}/staging/{index}-0 {closed}/.pyenv",
                          f"mount --bind {tmp_path}/staging/{index}-1 {closed}/.sortie"]
    assert sum(line.endswith(f"sortie-lab-view {closed}") for line in script) == 1


def test_a_failed_lab_starts_logs_are_kept_where_its_error_names_them(tmp_path: Path):
    """Before: the error said "see <home>/slurm-lab/log", and the lab's directory, logs and
    all, was removed as the start failed."""
    from sortie.fleet.slurm_lab_home import FAILED_LOGS, _keep_logs

    for attempt in ("first", "second"):
        (tmp_path / "slurm-lab" / "log").mkdir(parents=True)
        (tmp_path / "slurm-lab" / "log" / "mariadbd.out").write_text(f"{attempt}: Aborting\n")
        kept = _keep_logs(tmp_path, tmp_path / "slurm-lab")
        assert kept == tmp_path / FAILED_LOGS
        assert (kept / "mariadbd.out").read_text() == f"{attempt}: Aborting\n"
        assert not (tmp_path / "slurm-lab" / "log").exists()


def test_a_slurm_without_overlapping_steps_is_refused_by_its_version() -> None:
    """Every step of sortie's shares the allocation (`srun --overlap`, Slurm 20.11): an older
    Slurm's steps waited for the launch's to end. What `sinfo --version` says, read."""
    from sortie.stacks.slurm.slurm_sites import too_old

    assert too_old("slurm 22.05.8\n") is None and too_old("slurm 20.11.0") is None
    assert too_old("slurm-wlm 23.11.4") is None and too_old("no version") is None
    assert too_old("slurm 20.02.7") == ("Slurm 20.02.7 is older than 20.11: sortie's job steps "
                                         "share the allocation (`srun --overlap`), which it "
                                         "lacks")
