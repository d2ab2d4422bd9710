"""A job in a container image (`image:` in a task, `--image`): pulled on every node in parallel,
one container per node running torchrun (or the user's `run` line) in it.

The image is pulled by every node at once; the head's digest is the run's (a tag is resolved
once: `run.json` and the recorded task name the digest, and a node whose tag meant another
digest pulls the head's). The container shares the node's network and IPC (NCCL and gloo see
the node's interfaces, shared memory is the node's), mounts sortie's directory of the node at
the same path (the workdir, the run's directory, the trainer) and a checkpoint directory that
is a path, and gets the job's variables; secrets pass by name from the job's shell (`-e NAME`),
never on a command line. The runtime is the node's own, asked of its transport
(`NodeTransport.image_runtimes`): podman, else docker, run as the node's user (root's
podman rootful, another user's rootless: a cloud node whose first boot installed it). Where
the node has GPUs, the NVIDIA container toolkit's own flags pass them (podman: CDI's
``--device nvidia.com/gpu=all``; docker: ``--gpus all``).

What sortie pulled (an image the node did not have) or made (a setup's image) on a node is
listed in the node's directory (``images``), so that the teardown of nodes sortie made removes
exactly those (`removal_script`); containers carry the cluster's label and their node's
workdir's: two controllers on one machine may name clusters alike, and neither's teardown may
remove the other's containers."""

from __future__ import annotations

import hashlib
import secrets
import shlex
import time
from collections.abc import Mapping, Sequence

from pydantic import BaseModel, Field

from sortie.bootstrap.follow import LineSink, following
from sortie.bootstrap.node_calls import NodeError, on_all
from sortie.bootstrap.node_layout import node_dir
from sortie.bootstrap.registry_login import (
    PASSWORD_FROM_STDIN,
    RegistryLogin,
    identity_login,
    login_pull_line,
    retry_line,
    user_login,
)
from sortie.bootstrap.ssh_channel import run_with_input
from sortie.bootstrap.transport import NodeTransport
from sortie.core.errors import last_line
from sortie.core.image_ref import ImageRef, RegistryAuth
from sortie.core.inventory import Node

DRIVEN = ("podman", "docker")  # the runtimes sortie runs an image with, by preference
PULL_TIMEOUT_S = 3600.0  # an NGC image is ~10 GB
CONTAINER_RECORD = "container"  # in the run's directory: "<runtime> <name>" of its container
# In the node's directory, the runtime's output of its last pull: named anew each time (an
# earlier pull's is never read as this one's) and the one before removed.
PULL_LOG = "pull-{}.log"
IMAGES_FILE = "images"  # in the node's directory: "<runtime> <image>" sortie pulled or made
CLUSTER_LABEL = "sortie.cluster"
WORKDIR_LABEL = "sortie.workdir"  # the node's workdir: this cluster's alone, whatever its name
SETUP_REPOSITORY = "localhost/sortie-setup"  # a setup's result, committed (`setup_image`)
# podman raises its own limits to the most it may and hands containers more than a node's
# hard limits allow (runc: "error setting rlimit type 6"): a container gets the node shell's
# open files, and processes up to podman's own cap, as a job outside it would.
# A container of the same name is one a killed node left (the run's lock says no job of the
# run runs here): removed first. Its conmon died with it, so podman's first `rm -f` finds it
# "stopping" and fails; the second removes it. A node in a cgroup of its own (a local node's)
# keeps its container in it (`--cgroups=split`): what kills the node kills its job, as a
# machine's end would. A user's podman (rootless) may not make cgroups in its login's, which
# are root's ("mkdir .../ssh.service/runtime: permission denied", seen): its container goes
# where podman puts it. On a machine whose cgroups are hybrid (v1, and a v2 hierarchy beside)
# with a controller left to v2, podman's crun refuses every container ("cgroups in hybrid mode
# not supported, drop all controllers from cgroupv2", seen: a kernel whose hugetlb only v2
# had); runc runs there, so a node that has it uses it (`HYBRID_CONTROLLERS`).
HYBRID_CONTROLLERS = "/sys/fs/cgroup/unified/cgroup.controllers"
_RUNTIME_FLAGS = (
    'case "$rt" in *podman) n=$(ulimit -Hu); { [ "$n" != unlimited ] && [ "$n" -lt 32768 ]; } '
    '|| n=32768\n  extra="--ulimit nofile=$(ulimit -Sn):$(ulimit -Hn) --ulimit nproc=$n:$n"\n'
    '  grep -qx "0::/" /proc/self/cgroup || [ "$(id -u)" != 0 ] || '
    'extra="$extra --cgroups=split"\n'
    f'  ! grep -qs . {HYBRID_CONTROLLERS} || '
    '! PATH="$PATH:/usr/sbin" command -v runc > /dev/null || extra="$extra --runtime runc" ;;\n'
    '  *) extra= ;;\nesac\n'
    '"$rt" rm -f "$name" > /dev/null 2>&1 || "$rt" rm -f "$name" > /dev/null 2>&1\n')
_GPU_FLAGS = 'case "$rt" in *podman) extra="$extra --device nvidia.com/gpu=all" ;; ' \
    '*) extra="$extra --gpus all" ;; esac\n'


class Pulled(BaseModel):
    """One node's pull of the job's image."""

    runtime: str = Field(max_length=16)  # "podman", "docker"
    image_id: str = Field(pattern=r"^(sha256:)?[a-f0-9]{12,64}$")
    digest: str | None = Field(default=None, pattern=r"^sha256:[a-f0-9]{64}$")
    size_bytes: int = Field(ge=0)
    seconds: float = Field(ge=0)  # asking the registry (a tag) and fetching what was missing
    fetched: bool  # False: the node had it already


def runtime_line(runtimes: Sequence[str]) -> str:
    """Shell: ``rt`` set to the node's first runtime of ``runtimes``, or exit 3 saying none."""
    found = " || ".join(f"command -v {shlex.quote(rt)}" for rt in runtimes)
    return (f'rt=$({found}) || {{ echo "sortie: no container runtime (neither '
            f'{" nor ".join(runtimes)})"; exit 3; }}\n')


def refusal(conn: NodeTransport, node: Node) -> str | None:
    """Why ``node`` cannot run a job's image through sortie (None: it can try)."""
    ways = conn.image_runtimes
    if not set(ways) & set(DRIVEN):
        return (f"{node.name}: its jobs run images through {' or '.join(ways)} (the site's own "
                "way), which sortie does not drive yet: run without `image` here")
    return None


def _why_pull_failed(output: str, image: str, node: str) -> str:
    """The pull's failure in one line naming the image and the node."""
    text = output.lower()
    last = last_line(output, "no output", 200)
    if "no container runtime" in text or last.startswith("sortie: "):  # said by our shell
        why = last.removeprefix("sortie: ")
    elif "docker daemon socket" in text or "cannot connect to the docker daemon" in text:
        why = (f"the node's user may not use docker ({last}): add it to the `docker` group in "
               "the node's image or first boot")
    elif "http response to https client" in text:
        why = ("the registry answers plain HTTP and the node's runtime asked HTTPS: serve it "
               "with TLS, or trust it on the nodes as a site does (podman: `insecure = true` "
               "for it in /etc/containers/registries.conf.d/; docker: `insecure-registries` "
               "in /etc/docker/daemon.json)")
    elif any(w in text for w in ("manifest unknown", "name unknown", "not found",
                                 "does not exist")):
        why = "no such image in its registry"
    elif any(w in text for w in ("unauthorized", "denied", "authentication required",
                                 "forbidden")):
        why = "the registry denied the pull (credentials: docs/your-job.md, 'Images')"
    elif any(w in text for w in ("connection refused", "no such host", "i/o timeout",
                                 "eof", "connection reset", "network is unreachable")):
        why = f"the registry could not be reached or stopped answering ({last})"
    else:
        why = last
    return f"{node}: pulling {image} failed: {why}"


def pull(conn: NodeTransport, node: Node, image: ImageRef, login: RegistryLogin | None = None,
         on_line: LineSink | None = None) -> Pulled:
    """``image`` on ``node``, pulled unless there, and what the node's runtime says of it;
    with ``login`` (the user's `registry_auth`), logged in as it says. The runtime's progress
    (a layer at a time) goes to ``on_line`` as it comes: a large image takes minutes."""
    ref, listing = shlex.quote(str(image)), shlex.quote(f"{node_dir(node)}/{IMAGES_FILE}")
    log = f"{node_dir(node)}/{PULL_LOG.format(secrets.token_hex(4))}"
    started = time.monotonic()
    # As the runtimes' own default (`--pull=missing`): an image already there, by digest or by
    # tag, is not asked for again; where a tag named another digest on another node, the
    # head's is pulled by digest (`pull_all`).
    fetch = '[ -z "$had" ]'
    # The user's login, else the node's own; denied by a cloud's registry: again, logged in
    # as the node (`registry_login`).
    identity = identity_login(image)
    fetching = (f'out=\n{login_pull_line(login, str(image), log)}' if login else
                f'"$rt" pull {ref} > {shlex.quote(log)} 2>&1 < /dev/null || {{ '
                f'out=$(tail -n 40 {shlex.quote(log)})\n' +
                (retry_line(identity, str(image), log) if identity else 'echo "$out"; exit 4\n')
                + "}")
    script = (
        (PASSWORD_FROM_STDIN if login else "") + runtime_line(conn.image_runtimes) +
        # Always there once a job used an image: its nodes' teardown looks for its containers.
        f"mkdir -p {shlex.quote(node_dir(node))} && touch {listing} || exit 1\n"
        f"rm -f {shlex.quote(node_dir(node))}/{PULL_LOG.format('*')}\n"
        f'had=$("$rt" image inspect --format "{{{{.Id}}}}" {ref} 2>/dev/null)\n'
        f'if {fetch}; then\n{fetching}\nfi\n'
        f'now=$("$rt" image inspect --format "{{{{.Id}}}}" {ref})\n'
        f'fetched=no; [ "$now" = "$had" ] || {{ fetched=yes; echo "$(basename "$rt") {ref}" >> '
        f"{listing}; }}\n"
        f'echo "sortie-image $(basename "$rt") $fetched $("$rt" image inspect --format '
        f"'{{{{.Id}}}} {{{{.Size}}}} {{{{range .RepoDigests}}}}{{{{.}}}} {{{{end}}}}' {ref})\"")
    with following(conn, node, log, on_line):
        result = (run_with_input(conn, script, login.stdin.encode(), PULL_TIMEOUT_S) if login
                  else conn.run(script, timeout=PULL_TIMEOUT_S))
    seconds = time.monotonic() - started
    line = next((line for line in result.stdout.splitlines() if line.startswith("sortie-image ")),
                "")
    if not result.ok or not line:
        raise NodeError(_why_pull_failed(result.stdout + result.stderr, str(image), node.name))
    words = line.split()[1:]
    runtime, fetched, image_id, size, *digests = words + ["?"] * max(0, 4 - len(words))
    digest = image.digest or next((d.split("@", 1)[1] for d in digests if "@" in d and
                                   image.same_repository(d.split("@", 1)[0])), None)
    try:
        return Pulled(runtime=runtime, image_id=image_id, digest=digest, size_bytes=int(size),
                      seconds=seconds, fetched=fetched == "yes")
    except ValueError:  # a node's answer, untrusted
        raise NodeError(f"{node.name}: the runtime said {line[:120]!r} of {image}") from None


def image_store(conn: NodeTransport) -> str:
    """Which image store a node's runtime keeps its images in: its machine, user and runtime
    (nodes that are one machine's processes share it)."""
    said = conn.run(runtime_line(conn.image_runtimes) +
                    'echo "sortie-store $(cat /etc/machine-id 2>/dev/null || hostname) '
                    '$(id -u) $rt"', timeout=60).stdout
    return next((line for line in said.splitlines() if line.startswith("sortie-store ")), said)


def pull_all(conns: Mapping[str, NodeTransport], nodes: Sequence[Node], image: ImageRef,
             auth: RegistryAuth | None = None, password: str = "",
             on_line: LineSink | None = None) -> tuple[ImageRef, dict[str, Pulled]]:
    """``image`` on every node in parallel; (the image by digest, each node's pull). Nodes that
    share an image store (one machine's) pull it once: one of them first, then the others find
    it. A tag is resolved once: to the head's digest (the first of ``nodes``); a node whose tag
    meant another digest (it moved meanwhile) pulls the head's. With ``auth`` (the task's
    `registry_auth`), every node logs in with it and ``password``."""
    login = user_login(image, auth, password) if auth else None
    for node in nodes:
        if why := refusal(conns[node.name], node):
            raise NodeError(why)
    stores = on_all(nodes, lambda n: image_store(conns[n.name])) if len(nodes) > 1 else [""]
    first = {store: node for store, node in reversed(list(zip(stores, nodes, strict=True)))}
    pulls: dict[str, Pulled] = {}
    for batch in (list(first.values()), [n for n in nodes if n not in first.values()]):
        pulls |= dict(zip((n.name for n in batch),
                          on_all(batch, lambda n: pull(conns[n.name], n, image, login, on_line)),
                          strict=True))
    head = pulls[nodes[0].name]
    if head.digest is None:
        raise NodeError(f"{nodes[0].name}: {image} has no registry digest there (an image "
                        "built on the node, never pushed): name one a registry serves")
    pinned = image.at(head.digest)
    moved = [n for n in nodes if pulls[n.name].digest != head.digest]
    if moved:
        pulls |= dict(zip((n.name for n in moved),
                          on_all(moved, lambda n: pull(conns[n.name], n, pinned, login, on_line)),
                          strict=True))
    return pinned, {node.name: pulls[node.name] for node in nodes}


IMAGE_PYTHON = "python3"  # a job's $SORTIE_PYTHON in its image: the image's own, on its PATH


def mounts(node: Node, env: Mapping[str, str]) -> list[str]:
    """What a container of ``node`` mounts at the same path: sortie's directory of the node
    (the workdir, the run, the trainer) and a checkpoint directory that is a path."""
    checkpoints = env.get("SORTIE_CHECKPOINT_URL", "").removeprefix("file://")
    return [node.workdir, *([checkpoints] if checkpoints.startswith("/") else [])]


def job_line(node: Node, cluster_id: str, run_id: str, image: str, env: Mapping[str, str],
             secret_names: Sequence[str], workdir: str, command: Sequence[str],
             record: str) -> str:
    """The command that runs a run's job on ``node`` in ``image`` (its container recorded in
    ``record``, for `stop_line`)."""
    script = run_line(node, cluster_id, container_name(run_id, node), image, env, secret_names,
                      workdir, command)
    return f"sortie_container={shlex.quote(record)} bash -c {shlex.quote(script)}"


def describe_pulls(image: ImageRef, pulls: Mapping[str, Pulled]) -> str:
    """One line: the image by digest, its size, and each node's pull (or that it had it)."""
    size = next(iter(pulls.values())).size_bytes
    fetched = [f"{name} {p.seconds:.1f}s" for name, p in pulls.items() if p.fetched]
    cached = [name for name, p in pulls.items() if not p.fetched]
    return (f"image {image} ({size / 1e9:.2f} GB): " +
            "; ".join(([f"pulled on {', '.join(fetched)}"] if fetched else []) +
                      ([f"already on {', '.join(cached)}"] if cached else [])))


def container_name(run_id: str, node: Node, what: str = "job") -> str:
    """The name of ``node``'s container for a run: a run named by the user (`--name`) may be
    named alike by another controller on the machine (another user, a second clone's tests),
    and a container of the same name is removed before a job starts (`run_line`): the node's
    own directory, hashed, keeps the names apart."""
    own = hashlib.sha256(node_dir(node).encode()).hexdigest()[:8]
    return f"sortie-{what}-{run_id}-{node.name}-{own}"


def setup_key(image: str, fingerprint: str) -> str:
    """What names the image a setup makes of ``image``: one per image digest and setup
    fingerprint, so an unchanged setup on the same image is not run again."""
    return hashlib.sha256(f"{image}\0{fingerprint}".encode()).hexdigest()[:20]


def setup_image(key: str) -> str:
    """The image a setup makes (its result, committed), named by its `setup_key`."""
    return f"{SETUP_REPOSITORY}:{key}"


def run_line(node: Node, cluster_id: str, name: str, image: str, env: Mapping[str, str],
             secret_names: Sequence[str], workdir: str, command: Sequence[str],
             keep: bool = False) -> str:
    """Shell that runs ``command`` in ``image`` on ``node`` as one container named ``name``
    (removed when it ends unless ``keep``), in the foreground: its exit code is the command's.
    Where ``$sortie_container`` names a file, the runtime and the name are written there
    (`stop_line` reads them). Run it by ``bash -c``: it exits when it fails."""
    paths = dict.fromkeys(mounts(node, env))
    flags = [*(["--rm"] if not keep else []), "--init", "--name", name,
             "--label", f"{CLUSTER_LABEL}={cluster_id}",
             "--label", f"{WORKDIR_LABEL}={node.workdir}", "--network", "host", "--ipc", "host",
             "-w", workdir]
    for path in paths:
        flags += ["-v", f"{path}:{path}"]
    for key, value in env.items():
        flags += ["-e", f"{key}={value}"]
    for key in secret_names:  # the value from the job's shell, which read it
        flags += ["-e", key]
    made = " ".join(shlex.quote(path) for path in paths)
    return (f"{runtime_line(DRIVEN)}mkdir -p {made} || exit 1\nname={shlex.quote(name)}\n"
            f"{_RUNTIME_FLAGS}"
            f"{_GPU_FLAGS if node.gpus else ''}"
            '[ -z "$sortie_container" ] || echo "$rt $name" > "$sortie_container"\n'
            f'"$rt" run $extra {shlex.join(flags)} {shlex.quote(image)} {shlex.join(command)}')


def stop_line(record: str, grace_s: float) -> str:
    """Shell that stops the container a run's job started (``record``: what `run_line`
    wrote), waiting up to ``grace_s`` after its SIGTERM; nothing when there is none."""
    path = shlex.quote(record)
    return (f'if [ -r {path} ]; then read rt name < {path}; "$rt" stop -t {int(grace_s)} '
            '"$name" > /dev/null 2>&1; "$rt" rm -f "$name" > /dev/null 2>&1; fi\n')


def removal_script(cluster_id: str, workdirs: Sequence[str], listings: Sequence[str]) -> str:
    """Shell, run where nodes sortie made ran (its machine), that removes the containers of
    ``cluster_id`` whose nodes' workdirs are ``workdirs`` (both labels: another controller's
    cluster of the same name is not this one) and the images listed in ``listings``
    (`IMAGES_FILE`s): sortie's alone, never an image the node had. An image still used by
    another container stays (said)."""
    lines = []
    for rt in DRIVEN:
        for workdir in workdirs:
            lines.append(
                f"if command -v {rt} > /dev/null; then ids=$({rt} ps -aq --filter "
                f"label={shlex.quote(f'{CLUSTER_LABEL}={cluster_id}')} --filter "
                f"label={shlex.quote(f'{WORKDIR_LABEL}={workdir}')}); "
                f'[ -z "$ids" ] || {rt} rm -f $ids > /dev/null 2>&1 || '
                f"{rt} rm -f $ids > /dev/null 2>&1; fi")
    for listing in listings:
        lines.append(f"[ -r {shlex.quote(listing)} ] && sort -u {shlex.quote(listing)} | "
                     "while read rt image; do case \"$rt\" in podman|docker) "
                     '"$rt" rmi "$image" > /dev/null 2>&1 || ! "$rt" image inspect "$image" '
                     '> /dev/null 2>&1 || echo "kept $image (in use)";; esac; done')
    return "\n".join(lines) + "\n"
