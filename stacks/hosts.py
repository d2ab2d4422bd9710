"""A hosts file: machines sortie did not create, for `sortie attach NAME --hosts FILE` (issue 17).

    user: ubuntu                       # defaults for every host; each host may override
    identity_file: ~/.ssh/id_ed25519
    workdir: /scratch                  # optional: sortie works in <workdir>/sortie-<NAME>/
                                       #   (default: the user's home directory)
    rdzv_port: 29400                   # optional: torchrun's rendezvous port on the first host
    env: {NCCL_SOCKET_IFNAME: eth0}    # optional: for every job on these hosts
    hosts:
      - address: 10.0.0.5
        port: 22                       # optional
        private_address: 10.0.0.5      # optional: the address other nodes reach it by
        host_key: "ssh-ed25519 AAAA..."  # or known_hosts: ~/.ssh/known_hosts
        python: /opt/venv/bin/python   # optional

A hosts file is untrusted input like a task file: its size is capped, every field is checked,
and a bad one is one line naming it. Every host's key is pinned before anything connects: from
the file, from a known_hosts file, or (`--trust HOST=SHA256:...`) from the host itself once its
key is checked against the fingerprint the user gave. Nothing is trusted on first use.
"""

from __future__ import annotations

import base64
import getpass
import ipaddress
import re
import socket
from pathlib import Path
from typing import Annotated

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)

from sortie.core.errors import SortieError, UsageError, first_field_error
from sortie.core.inventory import (
    HOST,
    HOST_KEY,
    MAX_NODES,
    PLAIN_PATH,
    Inventory,
    LoginHost,
    Node,
    known_hosts_name,
)
from sortie.core.userfile import (
    RESERVED_ENV,
    RESERVED_PREFIX,
    check_env,
    read_capped,
    read_yaml,
)
from sortie.infra.keys import fingerprint

MAX_HOSTS_BYTES = 1 << 20
MAX_KNOWN_HOSTS_BYTES = 16 << 20
USER = re.compile(r"[a-z_][a-z0-9_.-]{0,31}")
FINGERPRINT = re.compile(r"SHA256:[A-Za-z0-9+/]{43}")
# A workdir base: "~" (the user's home), or an absolute path a shell needs no quoting for.
WORKDIR_BASE = re.compile(f"~|{PLAIN_PATH.pattern}|/")
DEFAULT_KEYS = ("~/.ssh/id_ed25519", "~/.ssh/id_ecdsa", "~/.ssh/id_rsa")  # as ssh tries them


def _matching(pattern: re.Pattern[str], what: str) -> AfterValidator:
    def check(value: str) -> str:
        if not pattern.fullmatch(value):
            raise ValueError(f"{value!r} is not {what}")
        return value
    return AfterValidator(check)


# What the C library would read as an IPv4 address in another form (127.000.001.001 is octal,
# 2130706689 a number, 0x7f.1 hex): the same machine under another name, so refused.
NUMERIC_HOST = re.compile(r"(0x[0-9a-f]*|[0-9]+)(\.(0x[0-9a-f]*|[0-9]+)){0,3}\.?", re.IGNORECASE)


def _host(value: str) -> str:
    if not HOST.fullmatch(value):
        raise ValueError(f"{value!r} is not a host name or address")
    if NUMERIC_HOST.fullmatch(value):
        try:
            ipaddress.IPv4Address(value)
        except ValueError:
            raise ValueError(f"{value!r}: write an IPv4 address as four numbers without leading "
                             "zeros (127.0.1.1)") from None
    return value


def same_machine_key(address: str) -> str:
    """One spelling of ``address`` (an IP address in its short form, a name in lowercase), so
    that two entries for one machine are seen as one."""
    try:
        return str(ipaddress.ip_address(address.strip("[]")))
    except ValueError:
        return address.lower().rstrip(".")


def _absolute_program(value: str) -> str:
    if not PLAIN_PATH.fullmatch(value) or "/../" in value:
        raise ValueError(f"{value!r} must be an absolute path of letters, digits and _.@+- "
                         "(no spaces, no shell)")
    return value


def _public_key(value: str) -> str:
    key = " ".join(value.split()[:2])  # a trailing comment is not part of the key
    if not HOST_KEY.fullmatch(key):
        raise ValueError(f'{key!r} is not a public host key ("ssh-ed25519 AAAA...")')
    key_type, data = key.split()
    try:  # the blob names its own type first: a length, then the name
        blob = base64.b64decode(data, validate=True)
        named = blob[4:4 + int.from_bytes(blob[:4], "big")].decode()
    except (ValueError, UnicodeDecodeError):
        named = ""
    if named != key_type:
        raise ValueError(f"{key_type} {data[:12]}... is not a valid {key_type} public key")
    return key


def _no_dot_dot(value: str) -> str:
    if "/../" in f"{value}/":
        raise ValueError(f"{value!r} must not go up a directory (..)")
    return value


def _env(env: dict[str, str]) -> dict[str, str]:
    check_env(env)
    return env


# The checked fields, the same wherever they appear (a file's default or one host's own, a
# stack's outputs).
HostName = Annotated[str, AfterValidator(_host)]
UserName = Annotated[str, _matching(USER, "a user name")]
Program = Annotated[str, AfterValidator(_absolute_program)]
PublicKey = Annotated[str, AfterValidator(_public_key)]
WorkdirBase = Annotated[str, _matching(WORKDIR_BASE, "~ or an absolute path without spaces"),
                        AfterValidator(_no_dot_dot)]
JobEnv = Annotated[dict[str, str], AfterValidator(_env)]  # names: identifiers, none reserved


class HostEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    address: HostName
    port: int = Field(default=22, ge=1, le=65535, strict=True)  # `port: true` is no port
    private_address: HostName | None = None
    host_key: PublicKey | None = None
    known_hosts: Path | None = None
    user: UserName | None = None
    identity_file: Path | None = None
    python: Program | None = None
    workdir: WorkdirBase | None = None

    @model_validator(mode="before")
    @classmethod
    def _an_address_alone(cls, data: object) -> object:
        """`- 10.0.0.5`, as dstack's SSH fleets write a host: its address, nothing else."""
        return {"address": data} if isinstance(data, str) else data


class HostsFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    user: UserName | None = None  # None: the local user's name, as ssh does
    identity_file: Path | None = None  # None: the first of DEFAULT_KEYS that exists
    python: Program | None = None  # None: the node's python3
    workdir: WorkdirBase = "~"
    rdzv_port: int = Field(default=29400, ge=1, le=65535)
    env: JobEnv = Field(default_factory=dict)
    hosts: list[HostEntry] = Field(min_length=1, max_length=MAX_NODES)


def load_hosts(path: Path) -> HostsFile:
    """A hosts file, checked; a UsageError naming the field when it is not right."""
    try:
        hosts = HostsFile.model_validate(read_yaml(path, MAX_HOSTS_BYTES, "hosts file"))
    except ValidationError as exc:
        raise UsageError(f"{path}: {first_field_error(exc)}") from None
    addresses = [(same_machine_key(h.address), h.port) for h in hosts.hosts]
    twice = next((h for h, key in zip(hosts.hosts, addresses, strict=True)
                  if addresses.count(key) > 1), None)
    if twice is not None:
        raise UsageError(f"{path}: hosts: the same address and port twice ({twice.address} "
                         f"port {twice.port})")
    return hosts


def parse_trust(values: tuple[str, ...]) -> dict[str, str]:
    """`--trust HOST=SHA256:...` flags, by host; a malformed one is one line naming it."""
    trusted: dict[str, str] = {}
    for value in values:
        host, _, given = value.partition("=")
        if not HOST.fullmatch(host) or not FINGERPRINT.fullmatch(given):
            raise UsageError(f"--trust {value}: expected HOST=SHA256:<43 characters>, as "
                             "`ssh-keygen -l` prints it")
        trusted[host] = given
    return trusted


def pinned_key(host: HostEntry, trusted: dict[str, str]) -> str | None:
    """The host key to pin for ``host``: from its entry, else from its known_hosts file. None
    when neither has it but the user gave its fingerprint (`--trust`): the key is then read
    from the host and checked against it (`check_presented`). A UsageError otherwise, or when
    a key found disagrees with the fingerprint the user gave too (never one silently over the
    other)."""
    found, where = host.host_key, "the hosts file"
    if not found and host.known_hosts is not None:
        found, where = _from_known_hosts(host, host.known_hosts), str(host.known_hosts)
    if found:
        given = trusted.get(host.address)
        if given is not None and fingerprint(found) != given:
            raise UsageError(f"--trust {host.address}: {where} pins {fingerprint(found)}, not "
                             f"{given}: refused (correct the one that is wrong)")
        return found
    if host.address in trusted:
        return None
    where = f" nor in {host.known_hosts}" if host.known_hosts else ""
    raise UsageError(f"hosts: {host.address} has no host_key{where}: sortie never trusts a "
                     f"host on first use. Give --trust {host.address}=SHA256:... ("
                     f"{how_to_fingerprint(host)})")


def how_to_fingerprint(host: HostEntry) -> str:
    """How to learn ``host``'s fingerprint without trusting the network it is asked over."""
    port = f"-p {host.port} " if host.port != 22 else ""
    return ("get it out of band: `ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub` on the "
            f"host, or `ssh-keyscan {port}{host.address} | ssh-keygen -lf -` over a network you "
            "trust")


def _from_known_hosts(host: HostEntry, known_hosts: Path) -> str | None:
    """``host``'s key in its known_hosts file. Read capped, and line by line as OpenSSH does: a
    line that is not a key (bad base64, not UTF-8, a marker) is skipped, never a traceback."""
    import paramiko  # (here: reading a hosts file is rare; `status` loads this module)

    path = known_hosts.expanduser()
    text = read_capped(path, MAX_KNOWN_HOSTS_BYTES, f" (known_hosts of {host.address})"
                       ).decode("utf-8", "replace")
    name = known_hosts_name(host.address, host.port)
    keys: dict[str, paramiko.PKey] = {}
    for line in text.splitlines():
        try:
            entry = None if line.startswith("@") else paramiko.hostkeys.HostKeyEntry.from_line(line)
        except Exception:  # noqa: BLE001 - paramiko raises several kinds for one bad line
            continue
        if entry is not None and entry.key is not None and any(
                known == name or (known.startswith("|1|")
                                  and paramiko.HostKeys.hash_host(name, known) == known)
                for known in entry.hostnames):
            keys.setdefault(entry.key.get_name(), entry.key)
    if not keys:
        return None
    for key_type in ("ssh-ed25519", "ecdsa-sha2-nistp256", "ssh-rsa"):
        if key_type in keys:
            return f"{key_type} {keys[key_type].get_base64()}"
    key = next(iter(keys.values()))
    return f"{key.get_name()} {key.get_base64()}"


def check_presented(host: HostEntry, presented: str, trusted: dict[str, str]) -> str:
    """The key ``host`` presented, once it matches the fingerprint the user gave; else a
    UsageError saying both, and nothing is pinned."""
    expected = trusted[host.address]
    found = fingerprint(presented)
    if found != expected:
        raise UsageError(f"--trust {host.address}: the host presented {found}, not {expected}: "
                         "refused (a different machine, or a man in the middle)")
    return presented


def presented_key(host: HostEntry, timeout_s: float = 10.0) -> str:
    """The host key ``host`` presents (ed25519 preferred), read without logging in: only ever
    pinned after `check_presented` matched it to the fingerprint the user gave."""
    import paramiko

    try:
        sock = socket.create_connection((host.address, host.port), timeout=timeout_s)
    except OSError as exc:
        raise SortieError(f"hosts: {host.address}:{host.port}: not reachable "
                          f"({exc.strerror or exc})") from None
    transport = paramiko.Transport(sock)
    try:
        options = transport.get_security_options()
        options.key_types = sorted(options.key_types, key=lambda t: t != "ssh-ed25519")
        transport.start_client(timeout=timeout_s)
        key = transport.get_remote_server_key()
        return f"{key.get_name()} {key.get_base64()}"
    except (paramiko.SSHException, OSError, EOFError) as exc:
        raise SortieError(f"hosts: {host.address}:{host.port}: no SSH host key read ({exc})"
                          ) from None
    finally:
        transport.close()


def _identity(hosts: HostsFile, host: HostEntry) -> Path:
    return identity_path(host.identity_file or hosts.identity_file, host.address)


def identity_path(given: Path | None, address: str) -> Path:
    """The private key to log in to ``address`` with: ``given``, else the first default key."""
    candidates = [given] if given else [Path(p) for p in DEFAULT_KEYS]
    for path in candidates:
        if path.expanduser().is_file():
            return path.expanduser().resolve()
    where = f"{given} does not exist" if given else f"none of {', '.join(DEFAULT_KEYS)} exists"
    raise UsageError(f"hosts: {address}: identity_file: {where} (the private key sortie "
                     "logs in with)")


LOGIN = re.compile(r"(?:(?P<user>[^@]+)@)?(?P<host>[^@:\[\]]+|\[[0-9a-fA-F:]+\])"
                   r"(?::(?P<port>[0-9]{1,5}))?")


def login_host(spec: str, identity: Path | None, trusted: dict[str, str],
               known_hosts: Path = Path("~/.ssh/known_hosts")) -> LoginHost:
    """A Slurm login node given as ``[user@]host[:port]``, its host key pinned as a hosts
    file's host's is: from ``known_hosts``, or read from it and checked against the
    fingerprint the user gave (`--trust HOST=SHA256:...`). Never trusted on first use."""
    found = LOGIN.fullmatch(spec)
    if not found:
        raise UsageError(f"--slurm: {spec[:80]!r} is not [USER@]HOST[:PORT]")
    try:
        host = HostEntry(address=found["host"].strip("[]"), port=int(found["port"] or 22),
                         user=found["user"], known_hosts=known_hosts
                         if known_hosts.expanduser().is_file() else None)
    except ValidationError as exc:
        raise UsageError(f"--slurm: {spec[:80]!r}: {first_field_error(exc)}") from None
    try:
        key = pinned_key(host, trusted) or check_presented(host, presented_key(host), trusted)
    except UsageError as exc:  # said of the flag, not of a hosts file
        raise UsageError(str(exc).replace("hosts: ", "--slurm: ", 1)) from None
    return LoginHost(address=host.address, port=host.port, user=host.user or getpass.getuser(),
                     key_path=identity_path(identity, host.address), host_key=key)


def hosts_inventory(hosts: HostsFile, name: str, trusted: dict[str, str]) -> Inventory:
    """The cluster the hosts file describes, every host key pinned (from the file, its
    known_hosts, or the host checked against ``--trust``), in the file's order: the first host
    is the head. Each node's ``workdir`` is the base its directory will be made in (`sortie
    attach` makes ``<base>/sortie-<name>`` and replaces it); ``gpus`` is found by preflight."""
    nodes = []
    for index, host in enumerate(hosts.hosts):
        key = pinned_key(host, trusted) or check_presented(host, presented_key(host), trusted)
        nodes.append(Node(
            name=f"node-{index}", address=host.address, port=host.port,
            user=host.user or hosts.user or getpass.getuser(), key_path=_identity(hosts, host),
            host_key=key, gpus=0, private_address=host.private_address or host.address,
            workdir=host.workdir or hosts.workdir,
            python=host.python or hosts.python or "python3"))
    return Inventory(cluster_id=name, backend="attached", nodes=nodes,
                     rdzv_port=hosts.rdzv_port, train_env=dict(hosts.env))


def hosts_for(inventory: Inventory) -> HostsFile:
    """A hosts file for a cluster this home holds, every host key pinned: what `sortie attach`
    takes to use the same machines from another home (a team's). A node's workdir becomes the
    base the attaching home works under (`<base>/sortie-<NAME>`, never the holder's own
    files); an attached cluster's base is the one it was given."""
    reserved = {name for name in inventory.train_env
                if name.startswith(RESERVED_PREFIX) or name in RESERVED_ENV}

    def base(workdir: str) -> str:
        here = Path(workdir)
        return str(here.parent) if inventory.backend == "attached" and \
            here.name == f"sortie-{inventory.cluster_id}" else workdir

    try:
        return HostsFile(
            rdzv_port=inventory.rdzv_port,
            env={k: v for k, v in inventory.train_env.items() if k not in reserved},
            hosts=[HostEntry(
                address=node.address, port=node.port, user=node.user,
                private_address=node.private_address if node.private_address != node.address
                else None, host_key=node.host_key, identity_file=node.key_path,
                python=None if node.python == "python3" else node.python,
                workdir=base(node.workdir)) for node in inventory.nodes])
    except ValidationError as exc:
        raise SortieError(f"{inventory.cluster_id}: cannot be written as a hosts file: "
                          f"{first_field_error(exc)}") from None


def hosts_yaml(hosts: HostsFile, cluster: str, written: str) -> str:
    """The hosts file as YAML, headed by where it came from and how to use it."""
    body = yaml.safe_dump(hosts.model_dump(mode="json", exclude_none=True,
                                           exclude_defaults=True) | {
        "hosts": [host.model_dump(mode="json", exclude_none=True, exclude_defaults=True)
                  for host in hosts.hosts]}, sort_keys=False, width=1000)
    return (f"# The nodes of sortie cluster {cluster}, {written}; every host key pinned.\n"
            f"# From another home: `sortie attach NAME --hosts THIS_FILE` (each identity_file\n"
            f"# must be readable there). Jobs of both homes then share these machines.\n{body}")
