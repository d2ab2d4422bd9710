"""Node checks: python present, torch installed (and which version), GPU count as expected, and
how NCCL will reach the other nodes (EFA through the aws-ofi-nccl plugin, or sockets)."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping

from pydantic import BaseModel, Field

from sortie.bootstrap.node_layout import node_dir, trainer_home
from sortie.bootstrap.ssh import NodeError, shell_env
from sortie.bootstrap.ssh_channel import run_with_input
from sortie.bootstrap.trainer_bundle import trainer_manifest
from sortie.bootstrap.transport import NodeTransport
from sortie.core.errors import last_line
from sortie.core.inventory import INTERFACE, Inventory, Node
from sortie.core.progress import some_of
from sortie.infra.cloud_init import STORE_DRIVERS, TTL_UNIT

# Runs on the node, once per node on a cold interpreter, so it stays lean (with many nodes per
# host its CPU adds up): it finds torch without importing it (an import costs seconds of CPU),
# reads the version from torch/version.py, imports neither json nor re, and counts the GPUs the
# trainer will see: CUDA_VISIBLE_DEVICES if set, else nvidia-smi. It prints key=value pairs.
PROBE = r"""
import os, shutil, sys
from importlib.util import find_spec
spec = find_spec("torch")
torch = "-"
if spec and spec.submodule_search_locations:
    try:
        with open(os.path.join(spec.submodule_search_locations[0], "version.py")) as f:
            for line in f:
                if line.startswith("__version__"):
                    torch = line.split("=", 1)[1].strip().strip("'\"")
    except OSError:
        from importlib.metadata import version
        torch = version("torch")
visible = os.environ.get("CUDA_VISIBLE_DEVICES")
if visible is not None:
    gpus = len([d for d in visible.split(",") if d.strip()])
else:
    import subprocess
    smi = shutil.which("nvidia-smi")
    out = subprocess.run([smi, "-L"], capture_output=True, text=True).stdout if smi else ""
    gpus = sum(1 for line in out.splitlines() if line.startswith("GPU "))
net = "socket"
provider = os.environ.get("FI_PROVIDER")
if provider:
    import subprocess
    names = ("libnccl-net.so", "libnccl-net-ofi.so")
    libs = [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d]
    plugin = [d for d in libs if any(os.path.exists(os.path.join(d, n)) for n in names)]
    ldconfig = shutil.which("ldconfig") or "/sbin/ldconfig"
    if not plugin and os.path.exists(ldconfig):  # found through /etc/ld.so.conf.d, as NCCL does
        cache = subprocess.run([ldconfig, "-p"], capture_output=True, text=True).stdout
        plugin = [os.path.dirname(line.split("=>", 1)[1].strip()) for line in cache.splitlines()
                  if "=>" in line and line.split()[0] in names]
    fi_info = shutil.which("fi_info") or "/opt/amazon/efa/bin/fi_info"
    listed = os.path.exists(fi_info) and subprocess.run(
        [fi_info, "-p", provider], capture_output=True).returncode == 0
    net = ("ofi:%s:%s" % (provider, plugin[0]) if plugin and listed else
           "socket:no-%s-provider" % provider if plugin else "socket:no-libnccl-net.so")
rsync = "yes" if shutil.which("rsync") else "no"
url = os.environ.get("SORTIE_CHECKPOINT_URL", "")
driver = STORE_DRIVERS.get(url.split("://", 1)[0]) if "://" in url else None
store = "-"
if driver:  # imported, not only found: a broken install fails here, not at the first checkpoint
    try:
        __import__(driver)
        store = driver
    except Exception:
        store = "no-" + driver
iface = "-"  # the interface that holds this node's address (argv[1]; not loopback's)
address = sys.argv[1] if len(sys.argv) > 1 else ""
if address and not address.startswith("127."):
    import fcntl, socket, struct
    for _, name in socket.if_nameindex():
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            try:
                held = socket.inet_ntoa(fcntl.ioctl(probe.fileno(), 0x8915, struct.pack(
                    "256s", name.encode()[:15]))[20:24])  # SIOCGIFADDR: its IPv4 address
            except OSError:
                continue
        if held == address:
            iface = name
            break
print("python=%d.%d.%d torch=%s gpus=%d net=%s rsync=%s store=%s iface=%s" % (
    *sys.version_info[:3], torch, gpus, net, rsync, store, iface))
""".replace("STORE_DRIVERS", repr(STORE_DRIVERS))


BUNDLE_TIMEOUT_S = 60  # unpacking a few tens of KB and probing: seconds at most


class NodeFacts(BaseModel):
    python: str
    torch: str | None
    gpus: int
    # How NCCL will reach other nodes: "socket" (plain TCP), "ofi:efa:<plugin dir>" (the
    # aws-ofi-nccl plugin over libfabric's EFA provider), or "socket:<why not ofi>" where the
    # cluster asks for a provider (FI_PROVIDER) the node cannot give: NCCL falls back, slowly.
    # A node's word: kept short (it reaches records and the terminal).
    net: str = Field(default="socket", max_length=300)
    rsync: bool = True  # the workdir sync needs it on the node
    # The checkpoint bucket's fsspec driver, as imported ("s3fs"), "no-<driver>", or "-": the
    # bucket is a path.
    store: str = Field(default="-", max_length=40)
    # What failed in a node's first boot without making it unusable ("": nothing).
    cloud_init: str = Field(default="", max_length=300)
    # Host keys (fingerprints) its sshd presented while it booted, before its pinned one.
    early_host_keys: list[str] = Field(default_factory=list)
    # The network interface that holds the node's address there (None: none found, or its
    # address is loopback's): gloo and NCCL bind there (`with_interfaces`).
    interface: str | None = Field(default=None, pattern=f"^{INTERFACE.pattern}$")

    @classmethod
    def parse(cls, line: str) -> NodeFacts:
        """From the probe's output line (KeyError / ValueError when it is not one)."""
        pairs = dict(item.split("=", 1) for item in line.split())
        interface = pairs.get("iface", "-")
        return cls(python=pairs["python"], gpus=int(pairs["gpus"]),
                   torch=None if pairs["torch"] == "-" else pairs["torch"],
                   net=pairs.get("net", "socket"), rsync=pairs.get("rsync", "yes") == "yes",
                   store=pairs.get("store", "-"),
                   interface=interface if interface != "-" and INTERFACE.fullmatch(interface)
                   else None)


def install_trainer(node: Node) -> str:
    """Commands that install the trainer's tar (on stdin) as its version's directory, whole or
    not at all: unpacked beside it, then renamed into place (atomic), unless that version is
    there already. Nodes on one file system may run this at once: the first rename wins, the
    others drop their copy; no file a running job reads is ever replaced.

    One already there is run only if its files are what the bundle holds, by content, and it
    holds no other (bytecode aside): a directory with any file changed or added (by hand, or by
    whoever could write there) is moved aside as ``.changed.*`` and a fresh copy installed."""
    home = shlex.quote(trainer_home(node))
    manifest = trainer_manifest()
    sums, count = shlex.quote(manifest), manifest.count("\n")
    unpack = shlex.quote("cannot unpack the trainer")
    return (f"home={home}\n"
            "intact() { [ -d \"$home/trainer\" ] && [ ! -L \"$home\" ] && "
            f"(cd \"$home\" && printf %s {sums} | sha256sum --quiet --strict -c - "
            ">/dev/null 2>&1) && [ \"$(find \"$home\" ! -type d ! -path '*/__pycache__/*' "
            f"| wc -l)\" -eq {count} ]; }}\n"
            'if intact; then cat > /dev/null\n'
            'else mkdir -p "${home%/*}" && new=$(mktemp -d "${home%/*}/.new.XXXXXX") && '
            '{ tar -xf - -C "$new" && { [ ! -e "$home" ] && [ ! -L "$home" ] || intact || '
            'mv -T "$home" "$(mktemp -u "${home%/*}/.changed.XXXXXX")" 2>/dev/null; '
            'mv -T "$new" "$home" 2>/dev/null; }; rm -rf "$new"; }\nfi\n'
            f'intact || {{ echo {unpack} >&2; exit 1; }}\n')


def check_node(conn: NodeTransport, node: Node, env: dict[str, str],
               bundle: bytes | None = None) -> NodeFacts:
    """Probe one node and fail, naming it, if it cannot run the trainer. Also makes sure the
    node's work directory exists and, given the trainer's ``bundle`` (a tar), unpacks it there:
    one remote command (every SSH round trip costs time, and every session the node's CPU)."""
    workdir, own = shlex.quote(node.workdir), shlex.quote(node_dir(node))
    failed = shlex.quote(f"cannot create {node.workdir}")
    command = (f"mkdir -p {workdir} {own} || {{ echo {failed} >&2; exit 1; }}\n"
               # `watch` waits on the job's lock (bootstrap/train.py): util-linux's flock.
               "command -v flock >/dev/null || { echo 'flock (util-linux) is not installed' "
               ">&2; exit 1; }\n")
    probe = (f"{shell_env(env)} {shlex.quote(node.python)} -c {shlex.quote(PROBE)} "
             f"{shlex.quote(node.private_address)}")
    if bundle is None:
        result = conn.run(command + probe)
        output, errors = result.stdout, result.stderr
    else:  # the tar on the command's stdin, read first; stdout and stderr come back together
        result = run_with_input(conn, command + install_trainer(node) + probe, bundle,
                                timeout=BUNDLE_TIMEOUT_S)
        output = errors = result.stdout
    if not result.ok:
        detail = last_line(errors, "no output")
        raise NodeError(f"{node.name}: node check failed: {detail}")
    line = next((line for line in reversed(output.splitlines()) if line.startswith("python=")),
                output.strip())
    try:
        facts = NodeFacts.parse(line)
    except (KeyError, ValueError):  # a node's answer, untrusted: never a traceback
        raise NodeError(f"{node.name}: node check printed {output.strip()[:120]!r}, "
                        "not its facts") from None
    if facts.torch is None:
        raise NodeError(f"{node.name}: torch is not installed for {node.python}")
    if facts.store.startswith("no-"):
        bucket = env.get("SORTIE_CHECKPOINT_URL", "").split("://", 1)[0]
        raise NodeError(f"{node.name}: the checkpoint bucket ({bucket}://) needs "
                        f"{facts.store[3:]}, which {node.python} cannot import (the node's "
                        "first boot installs it where the image lacks it: see "
                        "/var/log/cloud-init-output.log)")
    if facts.gpus != node.gpus:
        raise NodeError(f"{node.name}: expected {node.gpus} GPUs, the node has {facts.gpus}")
    return facts


def with_interfaces(inventory: Inventory, facts: Mapping[str, NodeFacts]) -> Inventory:
    """``inventory`` with each node's interface where its check (``facts``) found the one
    holding its address and none was known (a Slurm node's comes from its backend): gloo and
    NCCL then bind there on every backend, per node (names differ per node: `eth-n1`,
    `eth-n2`; `contract.cluster_environment`)."""
    nodes = [node.model_copy(update={"interface": facts[node.name].interface})
             if node.interface is None and node.name in facts and facts[node.name].interface
             else node for node in inventory.nodes]
    return inventory.model_copy(update={"nodes": nodes})


def facts_to_say(facts: dict[str, NodeFacts]) -> list[str]:
    """What the node checks found that a run goes on with but the user should know, by node:
    NCCL falling back to sockets, a first boot that went degraded, a key shown before the
    pinned one."""
    notes = []
    for name, found in sorted(facts.items()):
        if found.net.startswith("socket:"):
            notes.append(f"{name}: NCCL cannot use the cluster's fast network ({found.net[7:]}): "
                         "it falls back to sockets, many times slower")
        if found.cloud_init:
            notes.append(f"{name}: {found.cloud_init}")
        if found.early_host_keys:
            notes.append(f"{name}: while it booted, its sshd presented "
                         f"{', '.join(found.early_host_keys)} before its pinned host key "
                         "(not accepted; connected once the pinned key was in)")
    # Hosts set up apart (attached ones) may not agree: torch's collectives across versions
    # fail in ways that do not say so (a hang, a closed connection).
    pythons: dict[str, list[str]] = {}
    for name, found in sorted(facts.items()):
        minor = ".".join(found.python.split(".")[:2])
        pythons.setdefault(f"Python {minor} with torch {found.torch or 'missing'}", []).append(name)
    if len(pythons) > 1:
        notes.append("the nodes' Pythons differ: " + "; ".join(
            f"{which} on {some_of(names)}" for which, names in pythons.items()) +
            ": a job across them may fail without saying why (same versions, or an image)")
    return notes


def require_rsync(facts: dict[str, NodeFacts], nodes: list[Node]) -> None:
    """The workdir sync is rsync over SSH: a node the check found without it is named first."""
    missing = [node.name for node in nodes if node.name in facts and not facts[node.name].rsync]
    if missing:
        raise NodeError(f"{', '.join(missing)}: rsync is not installed there, and syncing the "
                        "workdir needs it (a node's first boot installs it where the image "
                        "lacks it, when it can reach a package mirror)")


# cloud-init modules without which a node is not sortie's: the sshd hold and host-key fetch
# (bootcmd), the scripts and timers (write_files), the login user and keys (users_groups, ssh)
# and the first-boot commands (runcmd, scripts_user: the TTL is armed there). Any other module
# failing (a package install without internet yet) leaves the node degraded: said, and the node
# check says what that left missing.
ESSENTIAL_MODULES = frozenset({"bootcmd", "write_files", "users_groups", "ssh", "runcmd",
                               "scripts_user"})
MAX_RESULT_BYTES = 65536  # cloud-init's result.json, a node's word: capped
FAILED_MODULE = re.compile(r"^\('([\w-]+)',")  # cloud-init's "('name', Exception(...))"


def cloud_init_failures(result_json: str) -> list[str]:
    """The modules that failed, from cloud-init's /run/cloud-init/result.json ("-" names a
    stage that failed outside any module; an unreadable file counts as one)."""
    try:
        errors = json.loads(result_json)["v1"]["errors"]
        assert isinstance(errors, list)
    except (ValueError, KeyError, TypeError, AssertionError):
        return ["-"]
    names = [match[1].replace("-", "_") if (match := FAILED_MODULE.match(str(e))) else "-"
             for e in errors]
    return list(dict.fromkeys(names)) or ["-"]


def first_boot_status(timeout_s: int) -> str:
    """The node's command: wait for cloud-init (exit 124 past ``timeout_s``), then print whether
    the TTL timer is armed, cloud-init's status code and, when it is 1 (errors), its result."""
    return ("command -v cloud-init >/dev/null || exit 0\n"
            f"timeout {timeout_s} cloud-init status --wait >/dev/null 2>&1; code=$?\n"
            "[ $code = 124 ] && exit 124\n"
            f"systemctl is-active --quiet {TTL_UNIT}.timer && echo ttl=armed || echo ttl=off\n"
            # 0 done; 2 done, degraded (newer cloud-init: warnings); 1 errors: which, below
            f"echo status=$code; [ $code = 1 ] && head -c {MAX_RESULT_BYTES} "
            "/run/cloud-init/result.json 2>/dev/null; exit 0")


def read_first_boot(node: Node, output: str, require_ttl: bool = False) -> str:
    """What `first_boot_status` printed: a failed essential module is a NodeError, as is
    (``require_ttl``: a node sortie made) a TTL timer not armed; returns "" or, for a degraded
    node, what failed (to be said). No output: no cloud-init, nothing to read."""
    lines = output.splitlines()
    if not lines:
        return ""
    log = "see /var/log/cloud-init-output.log on the node"
    if "status=1" in lines[:2]:
        failed = cloud_init_failures("\n".join(lines[2:]))
        essential = [name for name in failed if name in ESSENTIAL_MODULES or name == "-"]
        if essential:
            raise NodeError(f"{node.name}: cloud-init failed in {', '.join(essential)} ({log})")
        said = f"cloud-init: {', '.join(failed)} failed ({log}); the node check follows"
    else:
        said = "cloud-init finished degraded (warnings; " + log + ")" \
            if "status=2" in lines[:2] else ""
    if require_ttl and lines[0] != "ttl=armed":
        raise NodeError(f"{node.name}: its TTL timer ({TTL_UNIT}.timer) is not armed: the node "
                        f"would never power itself off ({log})")
    return said


def wait_for_cloud_init(conn: NodeTransport, node: Node, timeout_s: int = 1200,
                        require_ttl: bool = False) -> str:
    """Wait until the node's first-boot setup (cloud-init: host key, TTL timer, Python
    environment) has finished and read how it went (`read_first_boot`); a node without
    cloud-init has nothing to wait for."""
    result = conn.run(first_boot_status(timeout_s), warn=True, timeout=timeout_s + 60)
    if result.exited == 124:
        raise NodeError(f"{node.name}: cloud-init still running after {timeout_s}s")
    return read_first_boot(node, result.stdout, require_ttl)
