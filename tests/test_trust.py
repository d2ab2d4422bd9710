"""What a node, a stack's outputs or a second launch hands the controller cannot steer it (the
second security review, issue 28): each test here failed on the code before it."""

from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path

import pytest

from sortie.bootstrap.ssh import openssh_args
from sortie.bootstrap.sync import rsync_command
from sortie.core.errors import UsageError
from sortie.core.inventory import Node
from sortie.infra.keys import ed25519_key_pair, fingerprint
from sortie.stacks.cloud.automation import passphrase
from sortie.stacks.cloud.outputs import inventory_from_outputs

# Each test's mark is its own: `unit` starts no process, `e2e` does (issue 63).

HOST_KEY = ed25519_key_pair().public_openssh


def outputs(**changes: object) -> dict:
    base = {
        "cluster": "exp", "cloud": "aws", "ssh_user": "ubuntu", "workdir": "/home/ubuntu",
        "python": "/usr/bin/python3", "gpus_per_node": 8, "bucket_url": "s3://b",
        "client_private_key": "key",
        "nodes": [{"name": f"node-{i}", "public_address": f"198.51.100.{i + 1}",
                   "private_address": f"10.0.0.{i + 1}", "host_key": HOST_KEY,
                   "host_key_fingerprint": fingerprint(HOST_KEY), "spot": False}
                  for i in range(2)]}
    base.update(changes)
    return base


@pytest.mark.parametrize(("changes", "error"), [
    ({"ssh_user": "-oProxyCommand=touch ~/pwned #"}, "stack output ssh_user"),
    ({"train_env": {"X=1;touch ~/pwned;Y": "v"}}, "stack output train_env"),
    ({"train_env": {"SORTIE_CHECKPOINT_URL": "/tmp/x"}}, "set by sortie on every node"),
    ({"python": "python3; touch ~/pwned"}, "stack output python"),
    ({"workdir": "/srv/../etc"}, "stack output workdir"),
])
@pytest.mark.unit
def test_outputs_fields_are_checked_like_a_hosts_file(changes: dict, error: str, tmp_path):
    """Before: ssh_user, python and train_env names were taken as any string."""
    with pytest.raises(UsageError, match=error.replace("(", r"\(")):
        inventory_from_outputs(outputs(**changes), tmp_path / "key")


@pytest.mark.unit
def test_outputs_with_two_nodes_of_one_name_or_address_are_refused(tmp_path: Path):
    good = outputs()["nodes"]
    twins = [good[0], {**good[1], "name": "node-0"}]
    with pytest.raises(UsageError, match="node-0 appears twice"):
        inventory_from_outputs(outputs(nodes=twins), tmp_path / "key")
    same_place = [good[0], {**good[1], "public_address": good[0]["public_address"]}]
    with pytest.raises(UsageError, match="two nodes at 198.51.100.1 port 22"):
        inventory_from_outputs(outputs(nodes=same_place), tmp_path / "key")


def a_node(address: str = "198.51.100.7", user: str = "ubuntu") -> Node:
    return Node(name="node-0", address=address, port=22, user=user, key_path=Path("/k"),
                host_key=HOST_KEY, gpus=0, private_address=address, workdir="/w",
                python="/usr/bin/python3")


@pytest.mark.unit
def test_openssh_trusts_only_the_pinned_key_and_the_user_is_never_an_option():
    """Before: `sortie ssh` passed `user@host` (a user like `-oProxyCommand=...` became an
    option) and OpenSSH also read /etc/ssh/ssh_known_hosts and ~/.ssh/config's
    KnownHostsCommand and ControlMaster."""
    args = openssh_args(a_node(), Path("/state dir/known_hosts"))
    assert args[args.index("-l") + 1] == "ubuntu"
    options = {args[i + 1] for i, arg in enumerate(args) if arg == "-o"}
    assert {"GlobalKnownHostsFile=/dev/null", "KnownHostsCommand=none", "ControlPath=none",
            "StrictHostKeyChecking=yes",
            'UserKnownHostsFile="/state dir/known_hosts"'} <= options


@pytest.mark.unit
def test_rsync_brackets_an_ipv6_address():
    command = rsync_command(a_node("2001:db8::1"), Path("/kh"), Path("/src"), "/dst",
                            Path("/list"))
    assert command[-1] == "[2001:db8::1]:/dst/"
    # made first, by a mkdir that another host's sync into a shared directory cannot fail
    assert "--rsync-path=mkdir -p /dst && rsync" in command


@pytest.mark.unit
def test_an_empty_passphrase_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Before: an empty passphrase file (a Ctrl-C between touch and write) was used as is."""
    monkeypatch.delenv("PULUMI_CONFIG_PASSPHRASE", raising=False)
    (tmp_path / "pulumi").mkdir()
    (tmp_path / "pulumi" / "passphrase").write_text("")
    with pytest.raises(UsageError, match="passphrase is empty"):
        passphrase(tmp_path)
    monkeypatch.setenv("PULUMI_CONFIG_PASSPHRASE", "")
    with pytest.raises(UsageError, match="PULUMI_CONFIG_PASSPHRASE is empty"):
        passphrase(tmp_path / "elsewhere")


@pytest.mark.unit
def test_first_runs_at_once_end_with_one_passphrase(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("PULUMI_CONFIG_PASSPHRASE", raising=False)
    got: list[str] = []
    start = threading.Barrier(8)

    def first_run() -> None:
        start.wait()
        got.append(passphrase(tmp_path))

    threads = [threading.Thread(target=first_run) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    path = tmp_path / "pulumi" / "passphrase"
    assert len(got) == 8 and len(set(got)) == 1 and len(got[0]) >= 32
    assert path.read_text().strip() == got[0] and oct(path.stat().st_mode & 0o777) == "0o600"
    assert [p.name for p in path.parent.iterdir()] == ["passphrase"], "no temp file left"


@pytest.mark.unit
def test_node_text_reaches_a_terminal_as_plain_characters():
    """Before: a node's log line kept "\\x1b[2J" (clear screen) and OSC 52 (write the
    clipboard) in the live stream and in `sortie logs`."""
    from sortie.cli.render import terminal_safe

    line = "loss 1.0\x1b[2J\x1b]52;c;cm0gLXJmIH4=\x07 done\x1b[31m red\x1b[0m\x00\x9b"
    assert terminal_safe(line) == "loss 1.0 done red"
    assert terminal_safe("caf\udce9") == "caf?" and terminal_safe("a\tb [/]") == "a\tb [/]"


@pytest.mark.unit
def test_a_torch_version_that_looks_like_markup_is_shown_as_it_is():
    """Before: torch "[/]" raised rich's MarkupError in the preflight table, after the cluster
    had been recorded."""
    import io

    from rich.console import Console

    from sortie.bootstrap.preflight import NodeCheck, Preflight
    from sortie.cli.render import preflight_table

    out = Console(file=io.StringIO(), width=200)
    report = Preflight(cluster="lab", rendezvous="10.0.0.1:29400", nodes=[
        NodeCheck(node="node-0", address="10.0.0.1", ssh=True, python="/usr/bin/python3",
                  torch="[/]", gpus=0, problem="[bold]no\x1b[2J")])
    preflight_table(out, report)
    text = out.file.getvalue()
    assert "[/]" in text and "[bold]no" in text and "\x1b[2J" not in text


@pytest.mark.unit
def test_a_progress_bar_that_never_ends_its_line_is_bounded():
    """Before: the line writer kept every byte until a newline and split all of it again on
    every write (quadratic under `\\r` progress bars)."""
    from sortie.bootstrap.follow import MAX_LINE, LineWriter

    lines: list[str] = []
    writer = LineWriter("node-0", lambda node, line: lines.append(line))
    for percent in range(20_000):
        writer.write(f"\rtraining {percent % 100:3d}% |{'#' * 40}|")
        assert len(writer.pending) <= MAX_LINE + 60
    writer.write(" done\r\nnext line\n")
    assert lines[-2:] == ["training  99% |" + "#" * 40 + "| done", "next line"]
    writer.write("x" * (3 * MAX_LINE))
    assert lines[-1].endswith("[line cut]") and len(writer.pending) <= MAX_LINE


@pytest.mark.unit
def test_a_streamed_commands_runner_joins_nothing_and_keeps_a_bounded_tail():
    """Before: Invoke's runner joined everything a command had printed on every read, for
    watchers sortie never gives, and kept all of it: a job's log followed for hours (`watch`)
    cost the controller quadratic time (800k lines of a chatty job: 63 s to show, the job 3;
    18 s now) and unbounded memory. `benchmarks/node_lines.py` measures it side by side."""
    import io

    from invoke import Context
    from invoke.watchers import StreamWatcher

    from sortie.bootstrap.srun import STREAMED_KEPT_READS, StreamingLocal

    runner = StreamingLocal(Context())
    runner.watchers, runner.opts = [], {"out_stream": io.StringIO(), "err_stream": None}
    buffer = [f"read {i}\n" for i in range(2 * STREAMED_KEPT_READS)]
    runner.respond(buffer)
    assert len(buffer) == 2 * STREAMED_KEPT_READS, "trimmed in steps, not on every read"
    buffer.append("one more\n")
    runner.respond(buffer)
    assert len(buffer) == STREAMED_KEPT_READS and buffer[-1] == "one more\n"
    runner.opts = {"out_stream": None, "err_stream": None}  # captured for its caller: all kept
    buffer = [f"read {i}\n" for i in range(3 * STREAMED_KEPT_READS)]
    runner.respond(buffer)
    assert len(buffer) == 3 * STREAMED_KEPT_READS

    class Seen(StreamWatcher):  # a watcher given (none of sortie's): Invoke's way, as before
        streams: list[str] = []

        def submit(self, stream: str) -> list[str]:
            self.streams.append(stream)
            return []

    runner.watchers = [Seen()]
    runner.respond(["a", "b"])
    assert Seen.streams == ["ab"]


@pytest.mark.unit
def test_a_collected_logs_progress_bar_is_one_line_as_a_terminal_shows_it():
    """Before: `sortie logs` split a log at every `\\r` too: a tqdm epoch was a line per redraw
    (thousands), the first of them empty."""
    from sortie.bootstrap.follow import shown_lines

    log = "start\n" + "".join(f"\repoch 1: {i}/500" for i in range(501)) + "\nwindows\r\nend\n"
    assert shown_lines(log) == ["start", "epoch 1: 500/500", "windows", "end"]
    assert shown_lines("no newline at the end") == ["no newline at the end"]
    assert shown_lines("") == [] and shown_lines("\n\n") == ["", ""]


@pytest.mark.unit
def test_a_progress_bar_still_redrawing_is_shown_every_so_often():
    """Before: a tqdm bar that redraws one line with `\\r` for a whole epoch showed nothing
    until its newline, minutes of a silent spinner. Now its last whole state is shown once
    nothing was for REDRAW_EVERY_S, and the line's end as ever, each once."""
    from sortie.bootstrap.follow import LineWriter

    now = [0.0]
    lines: list[str] = []
    writer = LineWriter("node-0", lambda node, line: lines.append(line), redraw_every_s=10,
                        clock=lambda: now[0])
    writer.write("epoch 1\n")

    def bar(step: int) -> str:
        return f"{step:3d}%|{'#' * (step // 10):10s}| {step}/100"

    for step in range(1, 101):  # a redraw a second; the 50th comes in two reads
        now[0] = float(step)
        if step == 50:
            writer.write("\r" + bar(50)[:8])  # what is shown is never half a redraw
            writer.write(bar(50)[8:])
        else:
            writer.write("\r" + bar(step))
    writer.write("\n")
    # Every 10 s, the state before the latest redraw (the latest may be half written).
    assert lines == ["epoch 1", *(bar(step - 1) for step in range(10, 101, 10)), bar(100)]
    # A line ended with `\r\n` whose `\n` comes a read later is shown once, not twice.
    now[0] += 20
    writer.write("saved\r")
    now[0] += 20
    writer.write("x\r")
    writer.write("\n")
    assert lines[-2:] == ["saved", "x"]


@pytest.mark.e2e
def test_a_controller_on_another_machine_of_the_same_name_is_not_taken_for_dead():
    """Before: two machines with one host name made a live sortie look orphaned (the pid was
    looked up on the wrong machine), and reap tore it down."""
    import socket
    import time

    from sortie.stacks.records import Controller, this_machine

    gone_pid = subprocess.Popen(["true"])
    gone_pid.wait()
    twin = Controller(host=socket.gethostname(), pid=gone_pid.pid, started=time.time(),
                      heartbeat=time.time(), machine=f"{socket.gethostname()}/another-boot-id")
    assert not twin.gone(), "a recent heartbeat from another machine: alive"
    here = twin.model_copy(update={"machine": this_machine()})
    assert here.gone(), "on this machine, a pid that is gone is gone"
    assert Controller.me().machine == this_machine() and not Controller.me().gone()


@pytest.mark.unit
def test_the_heartbeat_and_the_job_record_never_drop_each_other(tmp_path: Path):
    """Before: the heartbeat's update of the record was an unlocked read-modify-write; a job
    saved between its read and its write was lost, and reap then tore down without
    collecting."""
    import time

    from sortie.core.job import Job
    from sortie.stacks.records import SortieRecord
    from tests.stack_double import DoubleCloud

    backend = DoubleCloud(tmp_path).backend(tmp_path / "home")
    backend._save(SortieRecord(cluster="exp", profile="aws-p3-dev", cloud="aws",
                               region="us-east-1", nodes=1, created=0, expires_at=0,
                               usd_per_hour=1.0, config={}))
    real_record = backend.record

    def slow_record(cluster_id: str):  # widen the window between the read and the write
        found = real_record(cluster_id)
        time.sleep(0.05)
        return found

    backend.record = slow_record
    beats = threading.Thread(target=lambda: [backend.claim("exp") for _ in range(6)])
    beats.start()
    time.sleep(0.02)
    backend.save_job("exp", Job(run_id="exp", procs_per_node=1))
    beats.join()
    record = real_record("exp")
    assert record.job is not None and record.job.run_id == "exp"
    assert record.controller is not None


@pytest.mark.unit
def test_a_new_run_never_writes_into_an_earlier_runs_directory(tmp_path: Path):
    """Before: reusing --name merged into the old runs/<name>/ (its summary, metrics and
    checkpoints showed in the new report). Refused before anything is made."""
    from sortie.core.progress import QuietReporter
    from sortie.engine.launch import run_sortie
    from sortie.engine.request import RunRequest
    from sortie.stacks.local.local_backend import LocalBackend

    (tmp_path / "runs" / "exp").mkdir(parents=True)
    home = tmp_path / "home"
    with pytest.raises(UsageError, match=r"runs/exp already holds an earlier run"):
        run_sortie(RunRequest(run_id="exp", runs_dir=tmp_path / "runs"), QuietReporter(),
                   LocalBackend(home))
    assert not home.exists(), "no cluster was started, no name taken"


@pytest.mark.unit
def test_an_rsync_too_old_for_mkpath_is_told_apart():
    from sortie.bootstrap.preflight import RSYNC_MIN, rsync_version

    assert rsync_version("rsync  version 3.2.7  protocol version 31") == (3, 2, 7)
    assert rsync_version("rsync  version 3.1.3  protocol version 31") < RSYNC_MIN
    assert rsync_version("openrsync: protocol version 29") is None


@pytest.mark.unit
def test_a_name_is_taken_whole_or_not_at_all(tmp_path: Path):
    """A launch killed right after taking its name left an empty state directory: no
    controller in it, so it read as a held cluster that nothing would ever end. The directory
    now appears with its files in one rename."""
    import time

    from sortie.core.naming import ABANDONED_S, TAKEN_FILE, NameTakenError, take

    path = take(tmp_path, "exp", {"controller.json": "{}"})
    assert sorted(p.name for p in path.iterdir()) == ["controller.json", TAKEN_FILE]
    with pytest.raises(NameTakenError):
        take(tmp_path, "exp")
    assert (path / "controller.json").read_text() == "{}", "the first one's, untouched"
    (tmp_path / "old").mkdir()  # an empty one, from before: nothing of anyone's in it
    assert (take(tmp_path, "old") / TAKEN_FILE).is_file()
    aside = tmp_path / ".taking-new-abc"  # a launch killed before its rename
    aside.mkdir()
    os.utime(aside, (time.time() - ABANDONED_S - 1,) * 2)
    take(tmp_path, "new")
    assert not aside.exists() and [p.name for p in tmp_path.iterdir()
                                   if p.name.startswith(".")] == []


@pytest.mark.unit
def test_a_state_directory_goes_whole_so_an_exec_always_sees_down_came(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """An `exec` on an attached cluster that `sortie down` detached said "exit unknown" with no
    word of the detach (CI at 985028d): it found the cluster's state directory still there, then
    no `going` marker in it, which `down`'s rmtree had just deleted. The directory now leaves in
    one rename before its files go, and the exec asks again when the marker is missing."""
    import shutil
    import time

    from sortie.core import naming
    from sortie.fleet.held_state import mark_going, went_during

    state = naming.take(tmp_path, "held")
    assert not went_during(state, 0.0), "never marked: the job ended on its own"
    mark_going(state)
    seen: list[bool] = []
    real_rmtree = shutil.rmtree

    def rmtree(path: Path, *args: object, **kwargs: object) -> None:
        (Path(path) / "going").unlink()  # its files go first, the marker among them
        seen.append(went_during(state, 0.0))  # an exec asking then
        real_rmtree(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(shutil, "rmtree", rmtree)
    naming.remove(state)
    assert seen == [True] and went_during(state, 0.0)
    assert not any(tmp_path.iterdir()), "nothing left aside"
    monkeypatch.undo()
    naming.remove(state)  # a second `down` finds nothing: no error
    (tmp_path / "kept").mkdir()
    (tmp_path / ".removing-kept-dead").mkdir()  # a `down` killed as the files went
    assert naming.names_in(tmp_path) == ["kept"], "listings never show what goes"
    os.utime(tmp_path / ".removing-kept-dead", (time.time() - naming.ABANDONED_S - 1,) * 2)
    shutil.rmtree(tmp_path / "kept")
    naming.take(tmp_path, "kept")
    assert not (tmp_path / ".removing-kept-dead").exists(), "cleared by the next take"


@pytest.mark.unit
def test_the_trainers_summary_is_read_as_untrusted(tmp_path: Path):
    """Before: json.loads of whatever the node left, and `summary['samples_per_s']` raised
    KeyError after teardown (no report, no record)."""
    from sortie.rundir.result import RunResult

    result = RunResult(run_id="r1", nodes=1, ranks=1, artifacts=tmp_path)
    (tmp_path / "artifacts").mkdir()
    summary = tmp_path / "artifacts" / "summary.json"
    summary.write_text('{"steps": 5, "final_loss": 0.5, "samples_per_s": 9.0, "x": "y"}')
    result.read_summary()
    assert result.summary == {"steps": 5, "final_loss": 0.5, "samples_per_s": 9.0}
    summary.write_text('{"steps": "many", "final_loss": "low"}')
    result.read_summary()
    assert result.summary is None and "ignored artifacts/summary.json" in result.warnings[0]
    summary.unlink()
    summary.symlink_to(tmp_path / "elsewhere.json")
    (tmp_path / "elsewhere.json").write_text('{"steps": 1}')
    result.read_summary()
    assert result.summary is None and "not a regular file" in result.warnings[-1]
