"""Private registries, for real on local nodes: a registry on loopback that asks for credentials,
podman, the login directory made and removed.

- The task's `registry_auth` (its password by name): a run through the CLI, its password never
  written anywhere, a wrong one and a missing one each one line.
- A pull a cloud's registry denies, again logged in as the node (`registry_login`). What cannot
  run here is the clouds' own token source (the instance role, the metadata server, the managed
  identity): the test's token comes from a file instead, through the same shell. Which
  registries take which way is `test_image_parts.py`'s."""

from __future__ import annotations

import contextlib
import glob
import os
import subprocess
from pathlib import Path

import pytest

from sortie.bootstrap import container
from sortie.bootstrap.node_calls import NodeError
from sortie.bootstrap.prepare import prepare
from sortie.bootstrap.registry_login import RegistryLogin
from sortie.core.image_ref import ImageRef
from sortie.stacks.local.local_backend import LocalBackend
from sortie.stacks.machine.image_lab import Registry, missing_tools
from tests.helpers import assert_nothing_left, needs_sshd, sortie
from tests.test_images import LAB
from tests.test_images import registry as open_registry  # noqa: F401 (a fixture)

pytestmark = [pytest.mark.e2e, needs_sshd]
WAY = "as the node (the test's token)"  # how the node logs in, as the failures say it


def logins_left(registry: str) -> list[str]:
    """Login directories a pull left in the machine's /tmp holding ``registry`` (this test's:
    a second clone's tests beside these make and remove their own there)."""
    left = []
    for path in glob.glob("/tmp/tmp.*/auth.json"):
        with contextlib.suppress(FileNotFoundError):  # one going as it is read
            if registry in Path(path).read_text():
                left.append(path)
    return left


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
    login = {"way": RegistryLogin(private.address, WAY, "lab", f"cat {token}")}
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
            assert logins_left(private.address) == []
            node_store_rmi(str(image))
            login["way"] = RegistryLogin(private.address, WAY, "lab", "false")
            with pytest.raises(NodeError, match=rf"node-0: pulling {image} failed: logging in "
                               rf"to {private.address} as the node \(the test's token\) failed"):
                container.pull(conns[node.name], node, image)
            token.write_text("wrong")
            login["way"] = RegistryLogin(private.address, WAY, "lab", f"cat {token}")
            with pytest.raises(NodeError, match=r"failed: denied, logged in as the node "
                               r"\(the test's token\): .*invalid username/password"):
                container.pull(conns[node.name], node, image)
    finally:
        node_store_rmi(str(image))
        backend.down("login")
    assert_nothing_left(sortie_home)


def held_privately(opened: Registry, root: Path, password: str) -> tuple[Registry, str]:
    """A registry that asks for user ``lab``'s ``password``, holding the torch image (pushed to
    the ``opened`` one first); the image's name there."""
    crypt = pytest.importorskip("crypt", reason="bcrypt for the registry's users: Python's crypt")
    held = LAB.push(LAB.torch_image(), opened, "torch-private:1")
    private = Registry(root, crypt.crypt(password, crypt.mksalt(crypt.METHOD_BLOWFISH)))
    return private.holding(opened), held.replace(opened.address, private.address)


@pytest.mark.timeout(900)
def test_the_tasks_registry_login_pulls_a_private_image_and_its_password_stays_unwritten(
        open_registry: Registry, sortie_home: Path, tmp_path: Path):  # noqa: F811
    private, image = held_privately(open_registry, tmp_path / "private", "s3cret")
    (tmp_path / "task.yaml").write_text(
        f"image: {image}\nregistry_auth: {{username: lab, password: REG_PW}}\n"
        "run: python3 -c \"import torch; print('torch', torch.__version__, 'in the image')\"\n")
    with private:
        missing = sortie("run", "task.yaml", "--nodes", "2", "--name", "nopw", cwd=tmp_path)
        assert missing.returncode == 2 and missing.stderr.count("\n") <= 1, missing.stderr
        assert "registry_auth.password: REG_PW not set" in missing.stderr
        wrong = sortie("run", "task.yaml", "--nodes", "2", "--name", "wrongpw", cwd=tmp_path,
                       env={"REG_PW": "wrong"}, timeout=600)
        said = " ".join((wrong.stdout + wrong.stderr).split())
        assert wrong.returncode == 1 and f"pulling {image} failed: denied, logged in as lab " \
            "with $REG_PW" in said, said[-2000:]
        run = sortie("run", "task.yaml", "--nodes", "2", "--name", "private", cwd=tmp_path,
                     env={"REG_PW": "s3cret"}, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert run.stdout.count("in the image") == 2, run.stdout[-3000:]
    # The pull logged in as the task says streams its progress too (before: a quiet spinner).
    assert any(" pull | Copying blob" in line for line in run.stdout.splitlines()), \
        run.stdout[-3000:]
    # Recorded by name, to run again; its value in no file sortie wrote, nor the node's logins.
    assert "password: REG_PW" in (tmp_path / "runs" / "private" / "task.yaml").read_text()
    written = [path for top in (tmp_path / "runs", sortie_home) for path in top.rglob("*")
               if path.is_file() and b"s3cret" in path.read_bytes()]
    assert written == []
    own = Path("/run/containers/0/auth.json")
    assert not own.exists() or private.address not in own.read_text()
    assert logins_left(private.address) == []
    assert_nothing_left(sortie_home)
