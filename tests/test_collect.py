"""Collection treats what a node or a bucket lists as untrusted: hostile names, symlinks on the
node or in the run directory, names sha256sum would escape, and runs bigger than the cap."""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from pathlib import Path, PurePosixPath

import paramiko
import pytest

from sortie.bootstrap import collect, ssh, verified_copy
from sortie.bootstrap.node_layout import run_dir
from sortie.stacks.local.local_backend import LocalBackend
from tests.helpers import needs_sshd

pytestmark = pytest.mark.e2e


class HostileListing:
    """A node's SFTP server that lists extra names in the run's ``out/`` directory, as a
    compromised or buggy node can: everything else is the real server's answer."""

    def __init__(self, sftp: paramiko.SFTPClient, out: str, names: list[str]) -> None:
        self.sftp, self.out, self.names = sftp, out, names

    def listdir_attr(self, path: str) -> list[paramiko.SFTPAttributes]:
        entries = self.sftp.listdir_attr(path)
        if path == self.out:
            for name in self.names:
                entry = paramiko.SFTPAttributes.from_stat(
                    self.sftp.stat(str(PurePosixPath(path) / name)), name)
                entries.append(entry)
        return entries

    def __getattr__(self, name: str):
        return getattr(self.sftp, name)


def node_run(backend: LocalBackend, cluster: str, files: dict[str, bytes]):
    """A one-node cluster whose run ``r1`` left ``files`` in its outputs; (conn, node, out)."""
    node = backend.up(cluster, 1).head
    out = Path(run_dir(node, "r1")) / "out"
    out.mkdir(parents=True)
    for name, data in files.items():
        (out / name).write_bytes(data)
    return ssh.connect(node), node, out


@needs_sshd
def test_hostile_names_from_a_node_never_leave_the_run_directory(
        backend: LocalBackend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    conn, node, out = node_run(backend, "c-names", {"metrics.jsonl": b"{}\n"})
    # A file the node could name with `..`: out/../../../planted, outside the run's directory.
    (out.parents[2] / "planted").write_bytes(b"from outside out/")
    secret = tmp_path / "controller-secret"
    secret.write_bytes(b"the controller's own file")
    (out / "stolen").symlink_to(secret)  # a real symlink on the node
    dest = tmp_path / "area" / "runs" / "r1"
    sftp = conn.sftp()
    hostile = HostileListing(sftp, str(out), ["../../../planted", "..", "/etc/hostname"])
    # What the node's SFTP server says; the rest is real.
    monkeypatch.setattr(collect, "open_sftp", lambda _conn: hostile)

    got = collect.collect(conn, node, "r1", dest, dest / "artifacts")
    conn.close()
    assert [a.path for a in got.artifacts] == ["artifacts/metrics.jsonl"]
    assert sorted(got.refused) == sorted([
        "node-0: '../../../planted' (not a plain file name)",
        "node-0: '..' (not a plain file name)",
        "node-0: '/etc/hostname' (not a plain file name)",
        "node-0: 'stolen' (a symlink)"])
    written = {p.relative_to(tmp_path) for p in tmp_path.rglob("*")
               if p.is_file() and "sortie-home" not in p.parts}  # (the node's disk is there)
    assert written == {Path("controller-secret"), Path("area/runs/r1/artifacts/metrics.jsonl")}


@needs_sshd
def test_a_symlink_in_the_run_directory_is_never_written_through(backend: LocalBackend,
                                                                 tmp_path: Path):
    conn, node, _out = node_run(backend, "c-plant", {"summary.json": b'{"steps": 1}'})
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "target").write_text("untouched")
    dest = tmp_path / "runs" / "r1"
    (dest / "artifacts").mkdir(parents=True)
    (dest / "artifacts" / "summary.json").symlink_to(outside / "target")
    (dest / "logs").symlink_to(outside)  # a directory on the way
    got = collect.collect(conn, node, "r1", dest, dest / "artifacts")
    conn.close()
    assert (outside / "target").read_text() == "untouched"
    assert got.artifacts == [] and len(got.refused) == 1
    assert got.refused[0].startswith("node-0: 'summary.json' (")
    assert list(outside.iterdir()) == [outside / "target"]


@needs_sshd
def test_a_collected_file_never_replaces_one_already_there(backend: LocalBackend,
                                                          tmp_path: Path):
    """Before: files were opened with O_TRUNC, so a node's `task.yaml` replaced the
    controller's. Now a file already there is never written over; the same bytes (a takeover
    collecting again) are kept as they are."""
    conn, node, _out = node_run(backend, "c-excl", {"task.yaml": b"workdir: ~/secret\n",
                                                    "same.txt": b"same"})
    dest = tmp_path / "runs" / "r1"
    dest.mkdir(parents=True)
    (dest / "task.yaml").write_text("the controller's task\n")
    (dest / "same.txt").write_bytes(b"same")
    got = collect.collect(conn, node, "r1", dest, dest)  # outputs aimed at the top, on purpose
    conn.close()
    assert (dest / "task.yaml").read_text() == "the controller's task\n"
    assert [a.path for a in got.artifacts] == ["same.txt"]
    assert len(got.refused) == 1 and "task.yaml" in got.refused[0] \
        and "already exists; not written over" in got.refused[0]


@needs_sshd
def test_a_node_cannot_hand_back_more_files_than_the_cap(backend: LocalBackend, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch):
    """Before: the listing of a node's outputs had no cap on its file count."""
    monkeypatch.setattr(collect, "MAX_FILES", 3)
    conn, node, _out = node_run(backend, "c-many", {f"f{i}.txt": b"x" for i in range(5)})
    dest = tmp_path / "runs" / "r1"
    got = collect.collect(conn, node, "r1", dest, dest / "artifacts")
    conn.close()
    assert len(got.artifacts) == 3
    assert got.refused == ["node-0: 'out' (more than 3 files; the rest were not copied)"]


@needs_sshd
def test_names_that_sha256sum_would_escape_are_collected_and_verified(backend: LocalBackend,
                                                                      tmp_path: Path):
    """Before: `sha256sum` printed `\\a\\nb` for a name with a newline, and the lookup of the
    node's digest failed with a KeyError."""
    files = {"line\nbreak.txt": b"one", "back\\slash.txt": b"two", "plain.txt": b"three"}
    conn, node, _out = node_run(backend, "c-odd", files)
    dest = tmp_path / "runs" / "r1"
    got = collect.collect(conn, node, "r1", dest, dest / "artifacts")
    conn.close()
    assert got.refused == []
    assert {a.path: a.sha256 for a in got.artifacts} == {
        f"artifacts/{name}": hashlib.sha256(data).hexdigest() for name, data in files.items()}


@needs_sshd
def test_the_byte_cap_stops_collection_with_a_clear_error(backend: LocalBackend,
                                                          tmp_path: Path):
    conn, node, _out = node_run(backend, "c-cap", {"big.bin": b"x" * 5000})
    with pytest.raises(verified_copy.CollectLimitError,
                       match=r"^the artifacts exceed --max-artifacts "
                             r"4K \(at node-0: big.bin\); nothing more was copied"):
        collect.collect(conn, node, "r1", tmp_path / "runs" / "r1", tmp_path / "runs" / "r1",
                        budget=verified_copy.Budget(4096))
    conn.close()


def test_hostile_keys_in_a_bucket_stay_inside_the_run_directory(aws_endpoint: str,
                                                                tmp_path: Path):
    """Keys are names like any other; S3 takes `..` in a key (a real S3 API, moto)."""
    import boto3

    s3 = boto3.client("s3", region_name="us-east-1")
    s3.create_bucket(Bucket="ckpt")
    step = "checkpoints/step-00000010"
    objects = {f"{step}/meta.json": json.dumps({"step": 10, "world_size": 1}).encode(),
               f"{step}/done-rank00000": b"", f"{step}/state.pt": b"weights",
               f"{step}/../../../../escaped.txt": b"outside"}
    for key, body in objects.items():
        s3.put_object(Bucket="ckpt", Key=key, Body=body)
    dest = tmp_path / "deep" / "runs" / "r1"
    got = collect.collect_checkpoint("s3://ckpt/checkpoints", dest)
    assert sorted(a.path for a in got.artifacts) == [
        "checkpoints/step-00000010/done-rank00000", "checkpoints/step-00000010/meta.json",
        "checkpoints/step-00000010/state.pt"]
    assert got.refused == ["bucket: '../../../../escaped.txt' ('..' is not a plain file name)"]
    assert [p for p in tmp_path.rglob("escaped.txt")] == []


def test_a_symlink_in_a_local_bucket_is_not_followed(tmp_path: Path):
    step = tmp_path / "bucket" / "checkpoints" / "step-00000010"
    step.mkdir(parents=True)
    (step / "meta.json").write_text(json.dumps({"step": 10, "world_size": 1}))
    (step / "done-rank00000").write_text("")
    secret = tmp_path / "secret"
    secret.write_text("not a checkpoint")
    (step / "link").symlink_to(secret)
    got = collect.collect_checkpoint(str(tmp_path / "bucket" / "checkpoints"),
                                     tmp_path / "runs" / "r1")
    assert got.refused == ["bucket: 'link' (not a plain file)"]
    assert not (tmp_path / "runs" / "r1" / "checkpoints" / "step-00000010" / "link").exists()


def test_a_checkpoint_collected_again_is_kept_and_a_different_one_refused(tmp_path: Path):
    """A controller taking over one killed while collecting finds the first copies there."""
    step = tmp_path / "bucket" / "checkpoints" / "step-00000010"
    step.mkdir(parents=True)
    (step / "meta.json").write_text(json.dumps({"step": 10, "world_size": 1}))
    (step / "done-rank00000").write_text("")
    dest = tmp_path / "runs" / "r1"
    first = collect.collect_checkpoint(str(tmp_path / "bucket" / "checkpoints"), dest)
    again = collect.collect_checkpoint(str(tmp_path / "bucket" / "checkpoints"), dest)
    assert again.refused == [] and again.artifacts == first.artifacts
    (dest / "checkpoints" / "step-00000010" / "meta.json").write_text("changed")
    third = collect.collect_checkpoint(str(tmp_path / "bucket" / "checkpoints"), dest)
    assert len(third.refused) == 1 and "already exists; not written over" in third.refused[0]
    assert (dest / "checkpoints" / "step-00000010" / "meta.json").read_text() == "changed"


# -- through the real command line ----------------------------------------------------------------


@needs_sshd
def test_run_refuses_a_symlink_a_node_plants_and_keeps_the_bucket(sortie_home: Path,
                                                                   tmp_path: Path):
    """Before: the node's symlink was followed and the controller file it pointed at copied
    into runs/<id>/ as if the node had written it."""
    from tests.helpers import exit_code, follow_until, start_run

    secret = tmp_path / "controller-secret"
    secret.write_text("the controller's own file")
    proc = start_run(tmp_path, "--nodes", "1", "-p", "1", "--steps", "40", "--name", "plant",
                     "--", "--log-every", "5")
    seen: list[str] = []
    planted: list[Path] = []

    def plant(line: str) -> bool:  # once the trainer's out/ exists on the node
        if "step" in line and not planted:
            head = LocalBackend(sortie_home).inventory("plant").head
            planted.append(Path(run_dir(head, "plant")) / "out" / "stolen")
            planted[0].symlink_to(secret)
        return bool(planted)

    follow_until(proc, seen, plant)
    assert exit_code(proc, seen, 120) == 1, "".join(seen)[-3000:]
    last = "".join(seen).strip().splitlines()[-1]
    assert last == ("sortie: error: training finished but its artifacts are not verified: "
                    "refused 1 files: node-0: 'stolen' (a symlink); kept: "
                    f"{sortie_home / 'kept' / 'plant'}"), last
    run = tmp_path / "runs" / "plant"
    assert not (run / "artifacts" / "stolen").exists()
    assert (run / "artifacts" / "summary.json").is_file(), "the node's other files were collected"
    manifest = json.loads((run / "manifest.json").read_text())
    assert "stolen" not in {entry["path"] for entry in manifest["files"]}


@needs_sshd
def test_run_stops_collecting_at_the_cap(sortie_home: Path, tmp_path: Path):
    from tests.helpers import sortie

    result = sortie("run", "--nodes", "1", "-p", "1", "--steps", "5", "--name", "cap",
                    "--max-artifacts", "1K", cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("sortie: error: training finished but its artifacts are not "
                           "verified: the artifacts exceed --max-artifacts 1K (at "), last
    assert last.endswith(f"raise --max-artifacts to collect them all; kept: "
                         f"{sortie_home / 'kept' / 'cap'}"), last
    assert (sortie_home / "kept" / "cap" / "checkpoints").is_dir()


FORGER = """\
import json, os
out = os.environ["SORTIE_ARTIFACT_DIR"]
with open(os.path.join(out, "task.yaml"), "w") as f:
    f.write("workdir: ~/secret\\nrun: cat k\\n")
with open(os.path.join(out, "summary.json"), "w") as f:
    json.dump({"steps": "many", "final_loss": "low"}, f)
with open(os.path.join(out, "preempted.json"), "w") as f:
    f.write("not json")
for name in ("logs", "checkpoints", "manifest.json", "report.html"):
    with open(os.path.join(out, name), "w") as f:
        f.write("planted")
os.makedirs(os.path.join(out, "nodes", "node-0"), exist_ok=True)
"""


@needs_sshd
def test_a_job_cannot_replace_the_controllers_files(sortie_home: Path, tmp_path: Path):
    """Before: a job's `task.yaml` in $SORTIE_ARTIFACT_DIR replaced runs/<id>/task.yaml (the
    file the user runs again), and its bad `summary.json` crashed the command after teardown
    (KeyError, no report.html, no run.json). Now what a node returns lands in artifacts/."""
    from tests.helpers import sortie

    work = tmp_path / "work"
    work.mkdir()
    (work / "forge.py").write_text(FORGER)
    result = sortie("run", "--workdir", str(work), "--script", "forge.py", "--nodes", "1",
                    "-p", "1", "--name", "forge", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    run = tmp_path / "runs" / "forge"
    assert "~/secret" not in (run / "task.yaml").read_text()
    assert "forge.py" in (run / "task.yaml").read_text()
    assert (run / "artifacts" / "task.yaml").read_text().startswith("workdir: ~/secret")
    assert (run / "logs" / "node-0.log").is_file() and (run / "report.html").is_file()
    assert "planted" not in (run / "report.html").read_text()
    assert json.loads((run / "manifest.json").read_text())["run_id"] == "forge"
    assert json.loads((run / "run.json").read_text())["result"]["ok"] is True
    assert "ignored artifacts/summary.json from the node" in result.stdout


@needs_sshd
def test_two_collections_on_one_connection_each_have_their_own_sftp_session(
        backend: LocalBackend, tmp_path: Path):
    """Before: every collection used the connection's one SFTP session, and two threads on it
    (two nodes of one name) blocked each other for good."""
    conn, node, _out = node_run(backend, "c-twice", {f"f{i}.bin": bytes(50_000) for i in range(40)})
    results: dict[int, verified_copy.Collected | BaseException] = {}

    def collect_into(index: int) -> None:
        dest = tmp_path / "runs" / f"r{index}"
        try:
            results[index] = collect.collect(conn, node, "r1", dest, dest / "artifacts")
        except BaseException as exc:  # noqa: BLE001 - said by the assertion below
            results[index] = exc

    threads = [threading.Thread(target=collect_into, args=(i,), daemon=True) for i in range(4)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 120  # (0.6 s here; a busy CI machine is slower)
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    hung = [thread.name for thread in threads if thread.is_alive()]
    conn.close()  # (after: closing it first would end a hung collection with an error)
    assert not hung, f"collections never ended: {hung}"
    # A CI run once saw one session's channel dropped ("Server connection dropped"); not seen
    # in 85 runs under load since: should it come again, this says which and how.
    failed = {i: repr(got) for i, got in results.items() if isinstance(got, BaseException)}
    assert not failed, failed
    assert [len(got.artifacts) for got in results.values()  # type: ignore[union-attr]
            ] == [40] * 4, results


@needs_sshd
def test_a_name_that_is_not_utf8_is_refused_by_name_and_the_rest_collected(
        backend: LocalBackend, tmp_path: Path):
    """Before: paramiko's strict decoding of the listing was a UnicodeDecodeError, and nothing
    of the node was collected."""
    conn, node, out = node_run(backend, "c-latin", {"ok.txt": b"fine"})
    (out / "sub").mkdir()
    (out / "sub" / os.fsdecode(b"caf\xe9.txt")).write_bytes(b"latin-1 name")
    dest = tmp_path / "runs" / "r1"
    got = collect.collect(conn, node, "r1", dest, dest / "artifacts")
    conn.close()
    assert [a.path for a in got.artifacts] == ["artifacts/ok.txt"]
    assert got.refused == ["node-0: 'sub' (holds a file name that is not UTF-8: nothing in it "
                           "was copied)"]
