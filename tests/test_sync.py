"""The workdir sync (`bootstrap/sync.py`) to a real 2-node local cluster: real rsync over real
sshd with the cluster's pinned host keys; ignore rules; removed files removed on the nodes, but
never what the job wrote there."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from sortie.bootstrap.node_layout import job_dir
from sortie.bootstrap.prepare import prepare
from sortie.bootstrap.sync import Sent, describe_sync, sync
from sortie.bootstrap.workdir import file_digests, plan_sync
from sortie.core.errors import UsageError
from sortie.core.inventory import Inventory
from sortie.stacks.local.local_backend import LocalBackend
from tests.helpers import needs_sshd

pytestmark = pytest.mark.e2e
needs_rsync = pytest.mark.skipif(shutil.which("rsync") is None,
                                 reason="rsync needed (`make test` installs it with apt)")


def tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def listing(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}


PROJECT = {"train.py": "print('hi')\n", "lib/model.py": "x = 1\n", "data/big.bin": "0" * 100,
           "notes.log": "log\n", ".gitignore": "*.log\ndata/\n", ".venv/bin/python": "",
           "lib/__pycache__/model.cpython-311.pyc": "", "ckpt/keep.txt": "mine\n"}


def test_ignore_rules_without_git(tmp_path: Path):
    plan = plan_sync(tree(tmp_path, PROJECT))
    assert plan.files == (".gitignore", "ckpt/keep.txt", "lib/model.py", "train.py")
    assert plan.rules.startswith(".gitignore;") and "4 files" in plan.describe()


def test_sortieignore_replaces_gitignore(tmp_path: Path):
    tree(tmp_path, {**PROJECT, ".sortieignore": "ckpt/\n"})
    assert plan_sync(tmp_path).files == (".gitignore", ".sortieignore", "data/big.bin",
                                         "lib/model.py", "notes.log", "train.py")


def test_in_a_git_repository_git_decides(tmp_path: Path):
    tree(tmp_path, {**PROJECT, "sub/.gitignore": "secret.txt\n", "sub/secret.txt": "s",
                    "sub/ok.txt": "ok"})
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".git" / "info" / "exclude").write_text("ckpt/\n")
    assert plan_sync(tmp_path).files == (".gitignore", "lib/model.py", "sub/.gitignore",
                                         "sub/ok.txt", "train.py")


def test_over_the_cap_names_the_largest_and_points_at_the_bucket(tmp_path: Path):
    """Before: only "more than the 1 GiB cap", and a user had to find what made it so."""
    tree(tmp_path, {"train.py": "x" * 12, "model.pt": "x" * 50, "data/a.bin": "x" * 60,
                    "data/b.bin": "x" * 60})
    with pytest.raises(UsageError, match=r"more than the 150 B cap \(--max-sync-bytes raises it"
                       r"\) to sync \(the largest: data/ 120 B, model.pt 50 B, train.py 12 B\)"
                       r"; leave what the job need not read out with .sortieignore or "
                       r".gitignore, and put datasets in the cluster's bucket"):
        plan_sync(tmp_path, max_bytes=150)


ENVIRONMENTS = {"venv/pyvenv.cfg": "home = /usr/bin\n", "venv/bin/python": "",
                "venv/lib/python3.11/site-packages/torch/__init__.py": "x" * 100,
                "envs/conda/conda-meta/history": "", "envs/conda/bin/python": "",
                "envs/notes.md": "kept\n"}


@pytest.mark.parametrize("git", [False, True], ids=["no git", "git"])
def test_python_environments_of_any_name_are_never_sent(tmp_path: Path, git: bool):
    """Before: a new user's `python -m venv venv` (no .gitignore yet) went to every node, or
    stopped the run at the cap as if it were a dataset; it runs only where it was made."""
    tree(tmp_path, {"train.py": "", **ENVIRONMENTS})
    if git:
        subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    plan = plan_sync(tmp_path)
    assert plan.files == ("envs/notes.md", "train.py")
    said = plan.describe()
    assert "envs/conda (a Python environment)" in said and "venv (a Python environment)" in said
    assert "Python environments excluded" in said


@needs_sshd
@needs_rsync
def test_sync_sends_removes_what_it_sent_and_keeps_what_the_job_wrote(
        tmp_path: Path, backend: LocalBackend):
    inventory: Inventory = backend.up("sync", 2)
    project = tree(tmp_path / "project", PROJECT)
    synced = tmp_path / "synced"
    destinations = [Path(job_dir(node)) for node in inventory.nodes]

    first = sync(inventory, plan_sync(project), synced)
    for destination in destinations:
        assert listing(destination) == {".gitignore", "ckpt/keep.txt", "lib/model.py",
                                        "train.py"}
    every_byte = sum(len(text) for name, text in PROJECT.items()
                     if name in listing(destinations[0]))
    assert first == {node.name: Sent(files=4, bytes=every_byte) for node in inventory.nodes}
    # The job writes on a node; the user removes a file, edits one and adds one.
    (destinations[0] / "outputs").mkdir()
    (destinations[0] / "outputs" / "model.pt").write_text("weights")
    (destinations[0] / "ckpt" / "step-1").write_text("checkpoint")
    (project / "lib" / "model.py").unlink()
    (project / "train.py").write_text("print('changed')\n")
    (project / "new.py").write_text("")
    again = sync(inventory, plan_sync(project), synced)
    # What this sync did, not what the workdir holds: train.py and new.py sent, model.py gone.
    assert again == {node.name: Sent(files=2, bytes=len("print('changed')\n"), deleted=1)
                     for node in inventory.nodes}
    assert describe_sync(again, ["node-0", "node-1"]) == [
        "workdir: sent 2 files (17 B): new.py, train.py; deleted 1: lib/model.py on node-0, "
        "node-1"]
    assert listing(destinations[0]) == {".gitignore", "ckpt/keep.txt", "ckpt/step-1",
                                        "new.py", "outputs/model.pt", "train.py"}
    assert (destinations[0] / "train.py").read_text() == "print('changed')\n"


@needs_sshd
@needs_rsync
def test_a_tampered_sync_list_deletes_nothing_outside_the_workdir(tmp_path: Path,
                                                                  backend: LocalBackend):
    inventory = backend.up("tamper", 1)
    node = inventory.nodes[0]
    outside = Path(node.workdir) / "precious.txt"
    outside.parent.mkdir(parents=True, exist_ok=True)
    outside.write_text("not ours")
    synced = tmp_path / "synced"
    synced.write_text("\0".join(["../precious.txt", str(outside)]))
    sync(inventory, plan_sync(tree(tmp_path / "project", {"a.py": ""})), synced)
    assert outside.read_text() == "not ours"
    assert listing(Path(job_dir(node))) == {"a.py"}


@needs_sshd
@needs_rsync
def test_a_resync_with_nothing_changed_runs_no_rsync(tmp_path: Path, backend: LocalBackend):
    """Over open connections a node whose copies match is skipped; any change in the workdir or
    on a node, or a new node, brings rsync back for that node. A same-size edit that keeps its
    modification time (within one tick of the clock, or the old time put back) is sent by its
    content (fourth review, issue 61: the node ran the old code while code.json named the
    new)."""
    inventory = backend.up("quick", 2)
    conns = prepare(inventory)
    try:
        project = tree(tmp_path / "project", {"train.py": "a = 1\n", "lib/util.py": "b = 2\n"})
        synced = tmp_path / "synced"

        def synced_to() -> list[str]:
            plan = plan_sync(project)
            return list(sync(inventory, plan, synced, conns=conns, digests=file_digests(plan)))

        assert synced_to() == ["node-0", "node-1"]
        assert synced_to() == []

        # The same size, edited within the second of the last sync: rsync's quick check, to the
        # second, would skip it.
        sent = (project / "train.py").stat().st_mtime_ns
        (project / "train.py").write_text("a = 3\n")
        os.utime(project / "train.py", ns=(sent + 1000, sent + 1000))
        assert synced_to() == ["node-0", "node-1"]
        assert {(Path(job_dir(n)) / "train.py").read_text() for n in inventory.nodes} == \
            {"a = 3\n"}
        was = (project / "train.py").stat()
        (project / "train.py").write_text("a = 4\n")
        os.utime(project / "train.py", ns=(was.st_atime_ns, was.st_mtime_ns))
        assert synced_to() == ["node-0", "node-1"]
        assert {(Path(job_dir(n)) / "train.py").read_text() for n in inventory.nodes} == \
            {"a = 4\n"}
        assert synced_to() == [], "and then nothing: the quick check holds again"
        # `chmod +x` changes no modification time (before: "workdir unchanged", not sent).
        (project / "train.py").chmod(0o755)
        chmodded = sync(inventory, plan_sync(project), synced, conns=conns)
        assert chmodded == {"node-0": Sent(files=1), "node-1": Sent(files=1)}, "no bytes"
        assert all((Path(job_dir(n)) / "train.py").stat().st_mode & 0o111 == 0o111
                   for n in inventory.nodes)
        unchanged = sync(inventory, plan_sync(project), synced, conns=conns)
        assert unchanged == {}
        assert describe_sync(unchanged, ["node-0", "node-1"]) == [
            "workdir unchanged on node-0, node-1"]
        # A job that edits a synced file on one node: that node gets the workdir's copy back.
        copy = Path(job_dir(inventory.nodes[1])) / "lib" / "util.py"
        copy.write_text("b = 9\n")
        assert synced_to() == ["node-1"]
        assert copy.read_text() == "b = 2\n"
        # A replaced node (its disk empty): only it is synced.
        shutil.rmtree(job_dir(inventory.nodes[0]))
        assert synced_to() == ["node-0"]
        # A removed file must be removed on the nodes: rsync runs everywhere.
        (project / "lib" / "util.py").unlink()
        assert synced_to() == ["node-0", "node-1"]
        assert not copy.exists()
    finally:
        for conn in conns.values():
            conn.close()


@needs_sshd
@needs_rsync
def test_odd_names_are_sent_and_what_is_not_sent_is_said(tmp_path: Path, backend: LocalBackend):
    """Before: a file name that is not UTF-8 was a traceback, and a symlinked directory was
    skipped without a word."""
    inventory = backend.up("odd", 1)
    project = tree(tmp_path / "project", {"train.py": "a = 1\n"})
    odd = os.fsencode(project) + b"/caf\xe9.txt"  # Latin-1, not UTF-8
    with open(odd, "w") as handle:
        handle.write("x")
    (tmp_path / "data").mkdir()
    (project / "data").symlink_to(tmp_path / "data")
    plan = plan_sync(project)
    assert "not sent: data (a symlinked directory)" in plan.describe()
    synced = tmp_path / "synced"
    assert list(sync(inventory, plan, synced)) == ["node-0"]
    assert os.path.exists(os.fsencode(job_dir(inventory.head)) + b"/caf\xe9.txt")
    assert list(sync(inventory, plan_sync(project), synced)) == ["node-0"]  # the list reads back


@needs_sshd
@needs_rsync
def test_files_that_became_ignored_are_deleted_on_the_nodes_and_named(tmp_path: Path,
                                                                      backend: LocalBackend):
    """Before: a file sent once and ignored later stayed on every node, and dropped out of the
    sync's list, so no later sync removed it; a re-sync said counts, never names."""
    inventory = backend.up("ignored", 2)
    project = tree(tmp_path / "project", {f"src/m{i}.py": f"{i}\n" for i in range(5)}
                   | {"secret.env": "TOKEN=1\n", "train.py": ""})
    synced = tmp_path / "synced"
    first = sync(inventory, plan_sync(project), synced)
    assert describe_sync(first, ["node-0", "node-1"]) == [
        "workdir: sent 7 files (18 B): secret.env, src/m0.py, src/m1.py and 4 more on node-0, "
        "node-1"]
    copy = Path(job_dir(inventory.nodes[1]))
    (copy / "outputs.txt").write_text("the job's")  # never sent: never deleted
    (project / ".gitignore").write_text("secret.env\nsrc/m4.py\n")
    again = sync(inventory, plan_sync(project), synced)
    assert again == {n.name: Sent(files=1, bytes=len("secret.env\nsrc/m4.py\n"), deleted=2)
                     for n in inventory.nodes}
    assert describe_sync(again, ["node-0", "node-1"]) == [
        "workdir: sent 1 file (21 B): .gitignore; deleted 2: secret.env, src/m4.py on node-0, "
        "node-1"]
    assert listing(copy) == {".gitignore", "outputs.txt", "train.py",
                             *(f"src/m{i}.py" for i in range(4))}
    assert (project / "secret.env").exists(), "only the nodes' copies go"
    # Known to be gone: the next sync has nothing to delete.
    assert sync(inventory, plan_sync(project), synced) == {n.name: Sent() for n in inventory.nodes}


@needs_sshd
@needs_rsync
def test_an_ignored_name_never_deletes_through_a_symlink_on_the_node(tmp_path: Path,
                                                                     backend: LocalBackend):
    """A name the sync list holds is deleted only inside the job directory: a directory on the
    node that is a symlink (the job made it, or the list was forged) leads nowhere else."""
    inventory = backend.up("linked", 1)
    node = inventory.nodes[0]
    precious = tmp_path / "elsewhere" / "data.bin"
    precious.parent.mkdir()
    precious.write_text("not ours")
    project = tree(tmp_path / "project", {"a.py": "", "data/data.bin": "x",
                                          ".sortieignore": "data/\n"})
    copy = Path(job_dir(node))
    copy.mkdir(parents=True)
    (copy / "data").symlink_to(precious.parent)
    synced = tmp_path / "synced"
    synced.write_bytes(b"data/data.bin")
    sync(inventory, plan_sync(project), synced)
    assert precious.read_text() == "not ours"


def test_sorties_runs_directory_and_home_inside_the_workdir_are_never_synced(tmp_path: Path):
    """Before: `cd proj; sortie exec dev --workdir .` wrote proj/runs/, and the next exec sent
    the last run's report, logs and run.json to every node."""
    project = tree(tmp_path / "project", {"train.py": "", "runs/dev-1/report.md": "r",
                                          "state/clusters/dev/id_ed25519": "key",
                                          "runsheet.txt": ""})
    plan = plan_sync(project, own={"runs directory": project / "runs",
                                   "home": project / "state", "elsewhere": tmp_path / "x"})
    assert plan.files == ("runsheet.txt", "train.py")
    assert "runs/ (sortie's runs directory), state/ (sortie's home)" in plan.describe()
    with pytest.raises(UsageError, match="it is sortie's runs directory"):
        plan_sync(project, own={"runs directory": project})
