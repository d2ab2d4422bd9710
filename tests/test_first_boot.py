"""A cloud node's first boot, as the controller waits for it and reads it: how long SSH may take
per backend (and what it waits for), what cloud-init's result says failed, and what the node
check says of rsync (installed at first boot only where the image lacks it, never a condition
of SSH)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sortie.bootstrap.checks import (
    PROBE,
    NodeFacts,
    cloud_init_failures,
    facts_to_say,
    read_first_boot,
    require_rsync,
)
from sortie.bootstrap.ssh import NodeError
from sortie.core.inventory import Node
from sortie.infra.cloud_home import SshWait
from sortie.infra.cloud_home import home as cloud_home
from sortie.stacks.attached.attached_backend import AttachedBackend
from sortie.stacks.local.local_backend import LocalBackend

# Each test's mark is its own: `unit` starts no process, `e2e` does (issue 63).


def result_json(*errors: tuple[str, Exception] | str) -> str:
    """cloud-init's /run/cloud-init/result.json as 22.4 writes it: `str()` of each failure."""
    import json

    return json.dumps({"v1": {"datasource": "DataSourceNoCloud", "errors": [
        str(error) for error in errors]}})


@pytest.mark.unit
def test_the_clouds_wait_for_ssh_as_long_as_their_nodes_take():
    """Before: 120 s for every backend, while a node's sshd waits for its host key, which waits
    for a grant that takes minutes (Azure: up to 10)."""
    waits = {cloud: cloud_home(cloud).ssh_wait for cloud in ("aws", "gcp", "azure")}
    assert all(20 * 60 <= wait.seconds <= 30 * 60 for wait in waits.values()), waits
    assert waits["azure"].seconds == 30 * 60 and "up to 10 min" in waits["azure"].waiting_for
    assert "Secret Manager" in waits["gcp"].waiting_for
    assert "Elastic IP" in waits["aws"].waiting_for
    assert waits["gcp"].line().startswith("up to 20 min: boot, the host key")
    assert LocalBackend(Path("/nonexistent")).ssh_wait.seconds == 120
    assert AttachedBackend.ssh_wait.seconds == 120
    assert SshWait(45, "sshd").line() == "up to 45 s: sshd"


@pytest.mark.unit
def test_each_clouds_waits_cover_its_documented_delays():
    """The clouds' documented delays, proven once as facts (issue 63: the rehearsals waited them
    out for real, 6 minutes of CI for GCP alone, and now run with delays of seconds): a node's
    SSH wait covers the grant its host key waits for (`infra/<cloud>/rehearsal.py`, each
    figure with its source) and a replacement's wait after the spot notice, and the wait for
    cloud-init (`wait_for_cloud_init`'s default) covers the grant too."""
    import inspect

    from sortie.bootstrap.checks import wait_for_cloud_init
    from sortie.infra.cloud_rehearsal import rehearsal

    cloud_init_s = inspect.signature(wait_for_cloud_init).parameters["timeout_s"].default
    documented = {"aws": (10.0, 120.0), "gcp": (120.0, 30.0), "azure": (600.0, 30.0)}
    for cloud, (grant_s, notice_s) in documented.items():
        facts = rehearsal(cloud)
        assert (facts.grant_s, facts.notice_s) == (grant_s, notice_s), cloud  # as sourced
        wait = cloud_home(cloud).ssh_wait.seconds
        assert wait >= 2 * (grant_s + notice_s), (cloud, wait)  # room for a slow boot too
        assert cloud_init_s > grant_s, (cloud, cloud_init_s)


@pytest.mark.unit
def test_cloud_inits_failed_modules_are_read_from_its_result():
    assert cloud_init_failures(result_json()) == ["-"], "exit 1 with no error listed"
    assert cloud_init_failures(result_json(
        ("package-update-upgrade-install", RuntimeError("apt-get failed")),
        ("scripts_user", RuntimeError("Runparts: 1 failures")))) == [
        "package_update_upgrade_install", "scripts_user"]
    assert cloud_init_failures(result_json("Traceback: the stage itself crashed")) == ["-"]
    assert cloud_init_failures("not json {") == ["-"]  # a node's word: never a traceback
    assert cloud_init_failures('{"v1": {"errors": "not a list"}}') == ["-"]


def run_probe(tmp_path: Path, path: str) -> NodeFacts:
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                          env={"PATH": path}, check=True)
    return NodeFacts.parse(done.stdout)


@pytest.mark.e2e
def test_the_node_check_says_whether_rsync_is_there(tmp_path: Path):
    assert run_probe(tmp_path, "/usr/bin:/bin").rsync is True
    empty = tmp_path / "bin"
    empty.mkdir()
    assert run_probe(tmp_path, str(empty)).rsync is False


@pytest.mark.unit
def test_a_sync_to_a_node_without_rsync_is_refused_naming_it():
    nodes = [Node(name=f"node-{i}", address="127.0.0.1", private_address="127.0.0.1", port=22,
                  user="u", key_path="/k", host_key="ssh-ed25519 AAAA", workdir="/w", gpus=0)
             for i in range(3)]
    facts = {n.name: NodeFacts(python="3.11.2", torch="2.13.0", gpus=0, rsync=n.name != "node-1")
             for n in nodes}
    require_rsync(facts, [nodes[0], nodes[2]])  # the replaced ones only: fine
    with pytest.raises(NodeError, match=r"^node-1: rsync is not installed there, and syncing "):
        require_rsync(facts, nodes)


@pytest.mark.unit
def test_a_degraded_first_boot_is_said_per_node():
    facts = {"node-0": NodeFacts(python="3", torch="2", gpus=0),
             "node-1": NodeFacts(python="3", torch="2", gpus=0, net="socket:no-efa-provider",
                                 cloud_init="cloud-init: package_update_upgrade_install failed")}
    assert facts_to_say(facts) == [
        "node-1: NCCL cannot use the cluster's fast network (no-efa-provider): it falls back "
        "to sockets, many times slower",
        "node-1: cloud-init: package_update_upgrade_install failed"]


@pytest.mark.unit
def test_nodes_whose_python_or_torch_differ_are_said_once():
    """Hosts set up apart (a lab's, attached): before, a job across two torch versions failed
    with a closed connection or hung, and nothing had said the nodes differ."""
    facts = {f"node-{i}": NodeFacts(python=f"3.11.{i}", torch="2.13.0", gpus=0)
             for i in range(5)}
    assert facts_to_say(facts) == [], "a patch release of Python is no difference"
    facts["node-3"] = NodeFacts(python="3.11.2", torch="2.12.1+cu121", gpus=0)
    facts["node-4"] = NodeFacts(python="3.10.12", torch=None, gpus=0)
    assert facts_to_say(facts) == [
        "the nodes' Pythons differ: Python 3.11 with torch 2.13.0 on node-0, node-1, node-2; "
        "Python 3.11 with torch 2.12.1+cu121 on node-3; Python 3.10 with torch missing on "
        "node-4: a job across them may fail without saying why (same versions, or an image)"]


@pytest.mark.parametrize(("profile", "driver"), [("aws-p4d", "s3fs"), ("gcp-a2", "gcsfs"),
                                                 ("azure-nd96", "adlfs")])
@pytest.mark.unit
def test_each_clouds_nodes_install_their_buckets_driver_and_a_missing_container_runtime(
        profile: str, driver: str):
    """Before: only Azure's setup installed its driver; a GCP node's trainer could not open its
    gs:// checkpoints. Each node's user data (read where the cloud reads it) installs its
    bucket's driver into the Python the probe linked; and, where the node's image has no
    container runtime for a job's image, podman (and NVIDIA's toolkit, and its CDI spec, where
    the node has GPUs and no toolkit), each only where missing."""
    import yaml

    from sortie.infra.cloud_init import (
        GPUS_FOR_PODMAN,
        PYTHON_LINK,
        RUNTIME_IF_MISSING,
        TOOLKIT_IF_MISSING,
        install_store_driver,
    )
    from sortie.infra.cloud_rehearsal import rehearsal
    from tests.helpers import evaluate_profile

    evaluation = evaluate_profile(profile)
    commands = yaml.safe_load(rehearsal(evaluation.spec.cloud).user_data(evaluation, "node-0")
                              )["runcmd"]
    probe = next(i for i, c in enumerate(commands) if PYTHON_LINK in " ".join(c))
    assert commands.index(list(install_store_driver(driver))) > probe
    assert f"-m pip install -q {driver}" in " ".join(install_store_driver(driver))
    runtime, toolkit, gpus = (commands.index(list(c)) for c in
                              (RUNTIME_IF_MISSING, TOOLKIT_IF_MISSING, GPUS_FOR_PODMAN))
    assert runtime < toolkit < gpus, "the CDI spec is written once both are there"
    assert RUNTIME_IF_MISSING[2].startswith("command -v podman >/dev/null || command -v docker")
    assert TOOLKIT_IF_MISSING[2].startswith("! command -v nvidia-smi >/dev/null || command -v "
                                            "nvidia-ctk")


@pytest.mark.unit
def test_a_failed_essential_module_or_an_unarmed_ttl_fails_the_node():
    node = Node(name="node-3", address="127.0.0.1", private_address="127.0.0.1", port=22,
                user="u", key_path="/k", host_key="ssh-ed25519 AAAA", workdir="/w", gpus=0)
    both = result_json(("package-update-upgrade-install", RuntimeError("no mirror")),
                       ("write_files", ValueError("bad encoding")))
    with pytest.raises(NodeError, match=r"^node-3: cloud-init failed in write_files \(see "):
        read_first_boot(node, f"ttl=armed\nstatus=1\n{both}")
    assert read_first_boot(node, "ttl=armed\nstatus=0\n") == ""
    assert read_first_boot(node, "ttl=armed\nstatus=2\n").startswith(
        "cloud-init finished degraded")
    assert read_first_boot(node, "") == "", "no cloud-init: nothing to read"
    with pytest.raises(NodeError, match="its TTL timer .* is not armed"):
        read_first_boot(node, "ttl=off\nstatus=0\n", require_ttl=True)
    assert read_first_boot(node, "ttl=off\nstatus=0\n") == "", "a host sortie did not make"
