"""What another user, a node or a bucket can plant cannot steer the controller or the job (the
fourth security review, issue 61): each test here failed on the code before it. The node's side
runs the very shell commands sortie sends, in a real shell here."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from pathlib import Path

import pytest
from fsspec.implementations.local import LocalFileSystem

from sortie.bootstrap import collect
from sortie.bootstrap.checks import install_trainer
from sortie.bootstrap.job_secrets import SecretsOverStdin
from sortie.bootstrap.node_layout import trainer_home
from sortie.bootstrap.trainer_bundle import trainer_bundle
from sortie.core.inventory import Node
from sortie.trainer.checkpoint_layout import NotRegularFileError, open_regular

# Each test's mark is its own: `unit` starts no process, `e2e` does (issue 63).


def node_at(workdir: Path) -> Node:
    return Node(name="node-0", address="127.0.0.1", port=22, user="u", key_path=Path("/k"),
                host_key="ssh-ed25519 AAAA", gpus=0, private_address="127.0.0.1",
                workdir=str(workdir))


def shell(command: str, stdin: bytes = b"") -> subprocess.CompletedProcess:
    return subprocess.run(["sh", "-c", command], input=stdin, capture_output=True, timeout=30)


@pytest.mark.e2e
def test_secrets_are_never_written_through_a_planted_link(tmp_path: Path):
    """High 2: `cat > secrets.env` followed a link planted at that name into the planter's
    file. The link is removed and the file made anew, mode 0600; the planted file is unchanged."""
    run_dir = tmp_path / "runs" / "r1"
    run_dir.mkdir(parents=True)
    trap = tmp_path / "attackers-file"
    trap.write_text("")
    (run_dir / "secrets.env").symlink_to(trap)
    sent = SecretsOverStdin({"TOKEN": "s3cret"}, str(run_dir / "secrets.env"))
    done = shell(sent.receive + "echo received\n", sent.stdin())
    assert done.returncode == 0 and done.stdout == b"received\n", done.stderr
    assert trap.read_text() == ""
    written = run_dir / "secrets.env"
    assert not written.is_symlink() and written.read_text() == "export TOKEN=s3cret\n"
    assert written.stat().st_mode & 0o777 == 0o600


def install(node: Node) -> subprocess.CompletedProcess:
    return shell(install_trainer(node) + "echo installed\n", trainer_bundle())


@pytest.mark.parametrize("change", ["edited", "added", "linked"])
@pytest.mark.e2e
def test_a_trainer_changed_on_the_node_is_replaced_not_run(tmp_path: Path, change: str):
    """High 2: a `trainers/<version>/` already there was run whatever it held (seeded by
    another user, a job, a hand). It is run only if every file is the bundle's by content and
    none was added; otherwise it is moved aside and a fresh copy installed."""
    node = node_at(tmp_path)
    home = Path(trainer_home(node))
    assert install(node).returncode == 0
    first = (home / "trainer" / "__init__.py").stat().st_ino
    assert install(node).returncode == 0  # intact: kept as it is
    assert (home / "trainer" / "__init__.py").stat().st_ino == first
    if change == "edited":
        (home / "trainer" / "torchrun.py").write_text("import os; os.system('id')\n")
    elif change == "added":
        (home / "trainer" / "sitecustomize.py").write_text("print('planted')\n")
    else:  # the version's directory is a link to someone else's copy
        elsewhere = tmp_path / "elsewhere"
        home.rename(elsewhere)
        home.symlink_to(elsewhere)
    done = install(node)
    assert done.returncode == 0 and done.stdout.endswith(b"installed\n"), done.stderr
    assert not home.is_symlink()
    assert sorted(p.name for p in (home / "trainer").iterdir()) == sorted(
        name.rsplit("/", 1)[1] for name in _bundle_names())
    assert "os.system" not in (home / "trainer" / "torchrun.py").read_text()
    assert len(list(home.parent.glob(".changed.*"))) == 1  # kept aside, named, not deleted


def _bundle_names() -> list[str]:
    import io
    import tarfile

    with tarfile.open(fileobj=io.BytesIO(trainer_bundle())) as tar:
        return tar.getnames()


@pytest.mark.parametrize("planted", ["fifo", "zero", "huge-world"])
@pytest.mark.unit
def test_a_bucket_entry_that_is_no_file_never_hangs_or_floods_the_controller(tmp_path: Path,
                                                                               planted: str):
    """Medium 3: a FIFO named meta.json blocked every `exec` (SIGTERM ignored) and a link to
    /dev/zero raised MemoryError; a world size of 10**12 asked for as many done markers. Such a
    checkpoint is not complete: the newest complete one is collected, within seconds."""
    checkpoints = tmp_path / "bucket" / "checkpoints"
    good, bad = checkpoints / "step-00000010", checkpoints / "step-00000020"
    for step in (good, bad):
        step.mkdir(parents=True)
        (step / "done-rank00000").write_text("")
    (good / "meta.json").write_text(json.dumps({"step": 10, "world_size": 1}))
    if planted == "fifo":
        os.mkfifo(bad / "meta.json")
    elif planted == "zero":
        (bad / "meta.json").symlink_to("/dev/zero")
    else:
        (bad / "meta.json").write_text(json.dumps({"step": 20, "world_size": 10**12}))
    found: list = []
    reader = threading.Thread(target=lambda: found.append(
        collect.collect_checkpoint(str(checkpoints), tmp_path / "runs" / "r1")), daemon=True)
    reader.start()
    reader.join(timeout=20)
    assert not reader.is_alive(), "collecting the bucket hung"
    assert [a.path for a in found[0].artifacts] == [
        "checkpoints/step-00000010/done-rank00000", "checkpoints/step-00000010/meta.json"]


@pytest.mark.unit
def test_a_bucket_file_swapped_for_a_fifo_after_listing_is_refused(tmp_path: Path):
    """Medium 3, the race: listed as a file, a FIFO by the time it is opened."""
    fifo = tmp_path / "meta.json"
    os.mkfifo(fifo)
    fs = LocalFileSystem()
    with pytest.raises(NotRegularFileError):
        open_regular(fs, str(fifo))
    link = tmp_path / "link"
    link.symlink_to("/dev/zero")
    with pytest.raises(OSError):
        open_regular(fs, str(link))


@pytest.mark.unit
def test_an_owner_from_a_shared_ledger_reaches_the_terminal_as_plain_characters():
    """Fourth review (issue 61), Low 16: an owner (a profile's, or another controller's, read
    from a shared ledger) carrying escape sequences reached the terminal in `sortie status`,
    and bidirectional controls, which reorder what follows, passed the log filter."""
    from rich.console import Console

    from sortie.cli.render import terminal_safe
    from sortie.cli.status_view import status_table
    from sortie.fleet.status import Fleet, OwnerTotal
    from sortie.stacks.listing import SortieRow

    owner = "eve\x1b]52;c;cm0gLXJmIH4=\x07\x1b[2J\u202eevil"
    fleet = Fleet(sorties=[SortieRow(name="x", backend="aws", owner=owner, detail=owner)],
                  owners=[OwnerTotal(owner=owner, sorties=1, nodes=1, usd_per_hour=1.0)],
                  usd_per_hour=1.0)
    console = Console(record=True, width=200, force_terminal=False)
    status_table(console, fleet)
    shown = console.export_text()
    assert "\x1b" not in shown and "\u202e" not in shown and "\x07" not in shown
    assert "eveevil" in shown
    assert terminal_safe("a\u2066b\u200fc\u202ad") == "abcd"
