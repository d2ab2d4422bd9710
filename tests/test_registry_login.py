"""A pull a cloud's registry denies is tried again logged in as the node (`registry_login`), for
real on a local node: a registry on loopback that asks for credentials, podman, the login
directory made and removed. What cannot run here is the clouds' own token source (the instance
role, the metadata server, the managed identity): the test's token comes from a file instead,
through the same shell. Which registries take which way is `test_image_parts.py`'s."""

from __future__ import annotations

import glob
import os
import subprocess
from pathlib import Path

import pytest

from sortie.bootstrap import container
from sortie.bootstrap.node_calls import NodeError
from sortie.bootstrap.prepare import prepare
from sortie.bootstrap.registry_login import IdentityLogin
from sortie.core.image_ref import ImageRef
from sortie.stacks.local.local_backend import LocalBackend
from sortie.stacks.machine.image_lab import Registry, missing_tools
from tests.helpers import assert_nothing_left, needs_sshd
from tests.test_images import LAB

pytestmark = [pytest.mark.e2e, needs_sshd]


def node_store_rmi(image: str) -> None:
    """``image`` out of the machine's podman store (the local node's), where it is."""
    subprocess.run(["podman", "rmi", "-f", image], capture_output=True)


def test_a_denied_pull_logs_in_as_the_node_pulls_and_keeps_no_login(
        sortie_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    if os.geteuid() != 0 or missing_tools():
        pytest.skip("podman and docker-registry as root (`make test` installs them)")
    crypt = pytest.importorskip("crypt", reason="bcrypt for the registry's users: Python's crypt")
    token = tmp_path / "token"
    token.write_text("s3cret")
    fresh = LAB.random_image(f"localhost/sortie-lab-login:{os.getpid()}", 2)
    try:
        with Registry(tmp_path / "open") as open_registry:
            held = LAB.push(fresh, open_registry, "team/private:1")
        private = Registry(tmp_path / "private", crypt.crypt(
            "s3cret", crypt.mksalt(crypt.METHOD_BLOWFISH))).holding(open_registry)
    finally:
        LAB.forget(fresh)
    image = ImageRef.parse(held.replace(open_registry.address, private.address))
    login = {"way": IdentityLogin(private.address, "the test's token", "lab", f"cat {token}")}
    monkeypatch.setattr(container, "identity_login", lambda asked: login["way"])
    backend = LocalBackend(sortie_home)
    inventory = backend.up("login", 1)
    node = inventory.head
    try:
        with private, prepare(inventory) as conns:
            pulled = container.pull(conns[node.name], node, image)
            assert pulled.fetched and pulled.digest, pulled
            # The node's own login file holds nothing of it; its login directory is gone.
            own = Path("/run/containers/0/auth.json")  # rootful podman's
            assert not own.exists() or private.address not in own.read_text()
            assert glob.glob("/tmp/tmp.*/auth.json") == []
            node_store_rmi(str(image))
            login["way"] = IdentityLogin(private.address, "the test's token", "lab", "false")
            with pytest.raises(NodeError, match=rf"node-0: pulling {image} failed: logging in "
                               rf"to {private.address} as the node \(the test's token\) failed"):
                container.pull(conns[node.name], node, image)
            token.write_text("wrong")
            login["way"] = IdentityLogin(private.address, "the test's token", "lab", f"cat {token}")
            with pytest.raises(NodeError, match=r"failed: denied again, logged in as the node "
                               r"\(the test's token\): .*invalid username/password"):
                container.pull(conns[node.name], node, image)
    finally:
        node_store_rmi(str(image))
        backend.down("login")
    assert_nothing_left(sortie_home)
