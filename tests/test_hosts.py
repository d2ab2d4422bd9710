"""A hosts file (`stacks/hosts.py`): machines sortie did not create. Every field is checked and
named when wrong; every host key is pinned before anything connects, never trusted on first use."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from sortie.core.errors import UsageError
from sortie.stacks.hosts import (
    HostEntry,
    check_presented,
    fingerprint,
    load_hosts,
    parse_trust,
    pinned_key,
)

# Each test's mark is its own: `unit` starts no process, `e2e` does (issue 63).


@pytest.fixture
def host_key(tmp_path: Path) -> str:
    """A real ed25519 public key, as `ssh-keygen` writes it."""
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "k")],
                   check=True)
    return (tmp_path / "k.pub").read_text().strip()


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "hosts.yaml"
    path.write_text(text)
    return path


@pytest.mark.e2e
def test_a_hosts_file_with_defaults_and_overrides(tmp_path: Path, host_key: str):
    hosts = load_hosts(write(tmp_path, f"""
user: ubuntu
identity_file: ~/.ssh/id_ed25519
hosts:
  - address: 10.0.0.5
    host_key: "{host_key}"
  - address: gpu-2.lab.example
    port: 2222
    private_address: 10.0.0.6
    user: admin
    python: /opt/venv/bin/python
    known_hosts: ~/.ssh/known_hosts
"""))
    first, second = hosts.hosts
    assert hosts.user == "ubuntu" and first.port == 22 and first.user is None
    assert first.host_key == " ".join(host_key.split()[:2]), "the comment is dropped"
    assert (second.port, second.user, second.python) == (2222, "admin", "/opt/venv/bin/python")


@pytest.mark.unit
def test_a_host_may_be_its_address_alone_as_dstack_writes_it(tmp_path: Path):
    # Before: "hosts.0: Input should be a valid dictionary or instance of HostEntry".
    hosts = load_hosts(write(tmp_path, "hosts:\n  - 10.0.0.5\n  - address: gpu-2.lab.example\n"))
    assert [(h.address, h.port, h.host_key) for h in hosts.hosts] == \
        [("10.0.0.5", 22, None), ("gpu-2.lab.example", 22, None)]


@pytest.mark.parametrize(("text", "error"), [
    ("hosts: []", "hosts: List should have at least 1 item"),
    ("hosts: [{address: 10.0.0.5, port: 0}]", "hosts.0.port: Input should be greater than"),
    ("hosts: [3]", "hosts.0: a mapping (NAME: value, a line each), not 3"),
    ("hosts: ['a b']", "hosts.0.address: 'a b' is not a host name"),
    ("hosts: 10.0.0.5", "hosts: a list ([a, b], or a `- ` line each), not the text '10.0.0.5'"),
    ("hosts: [{address: '-oProxyCommand=sh'}]", "hosts.0.address: '-oProxyCommand=sh' is not"),
    ("hosts: [{address: a, host_key: 'ssh-ed25519 not base64!'}]", "hosts.0.host_key:"),
    ("hosts: [{address: a, python: 'python3 -c x'}]", "hosts.0.python: 'python3 -c x' must be"),
    ("python: 'python3 -c x'\nhosts: [{address: a}]", "python: 'python3 -c x' must be"),
    ("hosts: [{address: a, colour: red}]", "hosts.0.colour: Extra inputs are not permitted"),
    ("user: 'root; rm'\nhosts: [{address: a}]", "user: 'root; rm' is not a user name"),
    ("hosts: [{address: a}, {address: a}]", "hosts: the same address and port twice"),
    ("hosts: [", "not a YAML hosts file"),
    ("env: {MASTER_PORT: '1'}\nhosts: [{address: a}]", "env: MASTER_PORT is set by sortie"),
    ("env: {SORTIE_CHECKPOINT_URL: /x}\nhosts: [{address: a}]", "SORTIE_CHECKPOINT_URL is set"),
])
@pytest.mark.unit
def test_a_bad_field_is_one_line_naming_it(tmp_path: Path, text: str, error: str):
    with pytest.raises(UsageError) as raised:
        load_hosts(write(tmp_path, text))
    message = str(raised.value)
    assert error in message and "\n" not in message, message


@pytest.mark.e2e
def test_fingerprint_is_what_ssh_keygen_prints(tmp_path: Path, host_key: str):
    listed = subprocess.run(["ssh-keygen", "-lf", str(tmp_path / "k.pub")], capture_output=True,
                            text=True, check=True).stdout.split()[1]
    assert fingerprint(host_key) == listed


@pytest.mark.e2e
def test_a_host_key_is_pinned_from_the_file_or_known_hosts_never_on_first_use(
        tmp_path: Path, host_key: str):
    key = " ".join(host_key.split()[:2])
    assert pinned_key(HostEntry(address="10.0.0.5", host_key=key), {}) == key
    known = tmp_path / "known_hosts"
    known.write_text(f"[10.0.0.6]:2222 {key}\n")
    assert pinned_key(HostEntry(address="10.0.0.6", port=2222, known_hosts=known), {}) == key
    with pytest.raises(UsageError, match=r"--trust 10\.0\.0\.6=SHA256:\.\.\. .*ssh-keyscan"):
        pinned_key(HostEntry(address="10.0.0.6", known_hosts=known), {})  # port 22: not listed
    with pytest.raises(UsageError, match=r"`ssh-keyscan -p 2200 10\.0\.0\.8 \| ssh-keygen"):
        pinned_key(HostEntry(address="10.0.0.8", port=2200), {})  # the hint names the port
    # With the user's fingerprint, the key will come from the host and be checked against it.
    trusted = parse_trust((f"10.0.0.7={fingerprint(key)}",))
    assert pinned_key(HostEntry(address="10.0.0.7"), trusted) is None
    assert check_presented(HostEntry(address="10.0.0.7"), key, trusted) == key
    other = f"ssh-ed25519 {'A' * 68}"
    with pytest.raises(UsageError, match="presented SHA256:.* not SHA256:.*refused"):
        check_presented(HostEntry(address="10.0.0.7"), other, trusted)


@pytest.mark.e2e
def test_a_trusted_fingerprint_that_disagrees_with_a_pinned_key_is_refused(tmp_path: Path,
                                                                             host_key: str):
    """Fourth review (issue 61), Low 13: `--trust HOST=SHA256:...` was ignored when the hosts
    file or known_hosts already had a key for the host, even one that did not match."""
    known = tmp_path / "known_hosts"
    known.write_text(f"10.0.0.7 {host_key}\n")
    other = parse_trust((f"10.0.0.7=SHA256:{'A' * 43}",))
    for entry, where in ((HostEntry(address="10.0.0.7", host_key=host_key), "the hosts file"),
                         (HostEntry(address="10.0.0.7", known_hosts=known), str(known))):
        with pytest.raises(UsageError, match=f"^--trust 10.0.0.7: {where} pins SHA256:"):
            pinned_key(entry, other)
        agreeing = parse_trust((f"10.0.0.7={fingerprint(host_key)}",))
        assert pinned_key(entry, agreeing).split()[:2] == host_key.split()[:2]


@pytest.mark.parametrize("flag", ["10.0.0.7", "10.0.0.7=MD5:aa", "-o=SHA256:" + "a" * 43])
@pytest.mark.unit
def test_a_malformed_trust_flag_is_refused(flag: str):
    with pytest.raises(UsageError, match=f"--trust {flag}: expected HOST=SHA256"):
        parse_trust((flag,))


@pytest.mark.unit
def test_machines_attached_twice_are_said_and_one_rendezvous_port_is_refused(tmp_path: Path):
    """Before: the same machines attached under two names with one rendezvous port, no word."""
    from sortie.core.inventory import Inventory, Node
    from sortie.fleet.attach_cluster import shared_machines
    from sortie.stacks.attached.attached_backend import AttachedBackend, Attachment

    def cluster(name: str, addresses: list[str], rdzv_port: int) -> Inventory:
        nodes = [Node(name=f"node-{i}", address=a, port=22, user="u", key_path=Path("/k"),
                      host_key="ssh-ed25519 AAAA", gpus=0, private_address=a, workdir="/w")
                 for i, a in enumerate(addresses)]
        return Inventory(cluster_id=name, backend="attached", nodes=nodes, rdzv_port=rdzv_port)

    backend = AttachedBackend(tmp_path)
    backend.state_dir("lab").mkdir(parents=True)
    backend.record("lab", cluster("lab", ["10.0.0.5", "10.0.0.6"], 29400),
                   Attachment(source="hosts file", origin="/h.yaml", attached_at=0))
    assert shared_machines(backend, cluster("other", ["10.0.0.7"], 29400)) == []
    assert shared_machines(backend, cluster("lab2", ["10.0.0.6", "10.0.0.5"], 29400)) == [
        "node-1 (10.0.0.5) is lab's node-0 too", "node-0 (10.0.0.6) is lab's node-1 too"]
    with pytest.raises(UsageError, match="29400 on 10.0.0.5 is the rendezvous port of attached "
                                         "cluster lab too"):
        shared_machines(backend, cluster("lab3", ["10.0.0.5"], 29400))
