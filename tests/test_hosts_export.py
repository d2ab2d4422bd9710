"""`sortie hosts NAME` (issue 47.17): a held cluster written as a hosts file, keys pinned, that
another home attaches as it is (before: attaching another home's nodes meant reading its
inventory.json)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from sortie.stacks.hosts import load_hosts
from sortie.stacks.local.local_backend import LocalBackend
from tests.helpers import needs_sshd, sortie

pytestmark = [pytest.mark.e2e, needs_sshd]


def test_a_held_cluster_as_a_hosts_file_is_attached_from_another_home(
        sortie_home: Path, tmp_path: Path, backend: LocalBackend):
    assert sortie("up", "--nodes", "2", "--name", "held", cwd=tmp_path).returncode == 0
    printed = sortie("hosts", "held", cwd=tmp_path)
    assert printed.returncode == 0, printed.stderr
    inventory = backend.inventory("held")
    document = yaml.safe_load(printed.stdout)
    assert [(h["address"], h["port"], h["host_key"]) for h in document["hosts"]] == [
        (n.address, n.port, n.host_key) for n in inventory.nodes], "every key pinned"
    assert not any(name.startswith("SORTIE_") for name in document.get("env", {})), \
        "sortie sets its own variables on every job"
    assert printed.stdout.startswith("# The nodes of sortie cluster held, written by")

    written = sortie("hosts", "held", "-o", "hosts.yaml", cwd=tmp_path)
    assert written.returncode == 0 and "wrote hosts.yaml" in written.stdout
    assert (tmp_path / "hosts.yaml").read_text() == printed.stdout
    load_hosts(tmp_path / "hosts.yaml")  # what attach reads, checked as it checks it
    refused = sortie("hosts", "held", "-o", "hosts.yaml", cwd=tmp_path)
    assert refused.returncode == 2 and "exists; sortie writes only a new file" in \
        refused.stderr

    team = {"SORTIE_HOME": str(tmp_path / "team-home")}
    attached = sortie("attach", "lab", "--hosts", "hosts.yaml", cwd=tmp_path, env=team)
    assert attached.returncode == 0, attached.stderr + attached.stdout
    (tmp_path / "task.yaml").write_text(
        "run: echo rank $SORTIE_NODE_RANK > $SORTIE_ARTIFACT_DIR/rank-$SORTIE_NODE_RANK\n")
    done = sortie("exec", "lab", "task.yaml", "--json", cwd=tmp_path, env=team)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["ok"]
    detached = sortie("down", "lab", cwd=tmp_path, env=team)
    assert detached.returncode == 0 and "detached" in detached.stdout + detached.stderr
    # The holder's cluster is untouched: its nodes still run, and its files are its own.
    status = json.loads(sortie("status", "--json", cwd=tmp_path).stdout)["sorties"]
    assert [(row["name"], row["nodes_up"]) for row in status] == [("held", 2)]
    assert not list(Path(inventory.nodes[0].workdir).glob("sortie-lab")), "detach removed it"
