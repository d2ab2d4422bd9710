"""The root file system that booted local nodes run (issue 49: nodes that boot, with cloud-init):
Debian bookworm from `debootstrap`, with what a cloud's GPU image has that sortie's user data
needs (systemd, cloud-init, openssh-server, python3, rsync, sudo, iproute2) and a container
runtime for jobs in images (podman), built once from this machine's Debian mirror and kept as a
zstd tarball, which each cluster unpacks once and every node
boots through an overlay of its own.

The image is named by what goes into it (`image_name`: the suite, the packages and the fixes
below): changing any of them builds a new one; `sortie images` lists and removes them.

What a plain debootstrap lacks for cloud-init to end ``status: done`` (checked facts,
`booted-nodes-and-slurm.md`):
- a generated locale (`update-locale` exits 255 without one);
- ``manage_etc_hosts`` (sudo cannot resolve the node's own name otherwise);
- no apt source (``packages:`` would wait on DNS: nothing leaves the machine);
- ``/var/lib/dbus/machine-id`` a link to ``/etc/machine-id``, which is empty (each node gets its
  own at its first boot, not a shared one);
- the NoCloud datasource only, with networking left to the namespace sortie made.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import stat
import struct
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sortie.core.errors import SortieError, UsageError
from sortie.core.statefile import not_private as untrusted
from sortie.stacks.machine.node_network import REGISTRY_ADDRESS

SUITE = "bookworm"
# python3-cffi-backend: python3-cryptography's virtual need, which debootstrap cannot resolve.
# python3-jsonschema: cloud-init checks user data against its schema only with it (a cloud's
# image has it; without it a schema error would pass here unseen).
PACKAGES = ("systemd", "systemd-sysv", "dbus", "openssh-server", "cloud-init", "python3",
            "python3-cffi-backend", "python3-jsonschema", "iproute2", "rsync", "sudo", "locales",
            "ca-certificates")
# A cloud's GPU image carries a container runtime (docs/clouds.md): here podman, run as root,
# for jobs in images (`bootstrap/container.py`). Its packages fail to configure inside debootstrap,
# so they are installed after it, from the same mirror.
RUNTIME_PACKAGES = ("podman", "catatonit", "runc", "uidmap")
# What podman needs inside a node's container (checked here, 2026-11-30): without
# CAP_SYS_ADMIN (`node.py`) it runs as rootless podman does, in a user namespace of its own;
# nspawn's seccomp filter refuses keyctl ("unable to create session key"); the node's cgroup has
# no pids controller ("pids.max: no such file"); its store, overlay, is a directory of the
# machine's bound in (`BootedNode.container_store`: not over the node's own overlay).
# A login user's podman (a rehearsed cloud's user: rootless, in the subordinate IDs `useradd`
# gives it, by uidmap's tools) keeps its store in that directory too, in one of its own that
# the node's maker gives it (`cloud_rehearsal.prepare_rehearsed_node`).
# The registry: the cluster's own, on its switch's address (`REGISTRY_ADDRESS`), plain HTTP as
# a site trusts its own (the tests start one there).
CONTAINER_STORE = "/var/lib/containers"  # where a node's container store is bound (`node.py`)
USER_STORES = "users"  # in it: a directory per login user, by uid (`BootedNode.user_store`)
CONTAINER_FILES = {
    "etc/containers/containers.conf": "[containers]\nkeyring = false\npids_limit = 0\n",
    "etc/containers/storage.conf": '[storage]\ndriver = "overlay"\nrunroot = "/run/containers/'
                                   f'storage"\ngraphroot = "{CONTAINER_STORE}/storage"\n'
                                   f'rootless_storage_path = "{CONTAINER_STORE}/{USER_STORES}/'
                                   '$UID"\n',
    # A login user has no systemd user session here (no pam_systemd): its podman's cgroups are
    # cgroupfs's, said once rather than warned at every call.
    "etc/skel/.config/containers/containers.conf": '[engine]\ncgroup_manager = "cgroupfs"\n',
    "etc/containers/registries.conf.d/50-sortie-cluster.conf":
        f'[[registry]]\nlocation = "{REGISTRY_ADDRESS}"\ninsecure = true\n',
}
# uidmap's helpers by file capability (Fedora's way) instead of setuid root (Debian's): as root,
# writing another user's namespace's ID map needs CAP_SYS_ADMIN, which a node lacks ("write to
# uid_map failed: Operation not permitted", seen); as the user who owns the namespace, with
# the one capability, it needs none. Kept through the image's tar (its xattrs).
ID_MAP_HELPERS = {"usr/bin/newuidmap": 7, "usr/bin/newgidmap": 6}  # CAP_SETUID, CAP_SETGID
_FILE_CAPABILITY = 0x02000001  # VFS_CAP_REVISION_2 | VFS_CAP_FLAGS_EFFECTIVE
TAR_XATTRS = "--xattrs --xattrs-include=security.capability"
LOCALE = "en_US.UTF-8"
CLOUD_CFG = """\
# sortie: booted local nodes read their user data from a NoCloud seed; their network is the
# namespace sortie made for them (no DHCP, nothing to configure).
datasource_list: [NoCloud, None]
network: {config: disabled}
manage_etc_hosts: true
"""
CACHE_ENV = "SORTIE_IMAGE_CACHE"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
APT_SOURCES = (Path("/etc/apt/sources.list"), Path("/etc/apt/sources.list.d"))
BUILD_TIMEOUT_S = 1800  # debootstrap takes ~2 minutes here; a slow mirror more
TOOLS = {"debootstrap": "debootstrap", "systemd-nspawn": "systemd-container", "zstd": "zstd"}
DIGEST_SUFFIX = ".sha256"  # beside each image: the SHA-256 of its file, written as it is built


@dataclass(frozen=True)
class Image:
    path: Path
    size_bytes: int
    built_at: float

    @property
    def age_s(self) -> float:
        return max(0.0, time.time() - self.built_at)


def cache_dir() -> Path:
    """Where images are kept: $SORTIE_IMAGE_CACHE, else the user's cache directory. Machine-wide
    rather than per $SORTIE_HOME: an image is the same for every controller on the machine."""
    given = os.environ.get(CACHE_ENV)
    if given:
        return Path(given).expanduser().absolute()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "sortie" / "images"


def image_name() -> str:
    """``bookworm-<12 hex>.tar.zst``: the digest of everything that goes into the image."""
    recipe = "\n".join([SUITE, *PACKAGES, *RUNTIME_PACKAGES, LOCALE, CLOUD_CFG,
                        *CONTAINER_FILES.values(), repr(ID_MAP_HELPERS), _fix_script("/root")])
    return f"{SUITE}-{hashlib.sha256(recipe.encode()).hexdigest()[:12]}.tar.zst"


def images() -> list[Image]:
    """The images kept, newest first (a partial build, ``*.part``, is not one)."""
    found = []
    directory = cache_dir()
    for path in directory.glob(f"{SUITE}-*.tar.zst") if directory.is_dir() else []:
        info = path.lstat()
        if path.is_file() and not path.is_symlink():
            found.append(Image(path, info.st_size, info.st_mtime))
    return sorted(found, key=lambda image: image.built_at, reverse=True)


def current_image() -> Image | None:
    """The image this sortie boots, if it was built here: this user's own, with its digest (one
    another user put in the cache, or one built before digests were kept, is built anew)."""
    image = next((image for image in images() if image.path.name == image_name()), None)
    if image is None or untrusted(cache_dir()) or untrusted(image.path) or \
            untrusted(_digest_file(image.path)):
        return None
    return image


def _digest_file(path: Path) -> Path:
    return path.with_name(path.name + DIGEST_SUFFIX)


def remove_images(keep_current: bool = False) -> list[Image]:
    """Remove the kept images (all, or all but the current one); return what was removed."""
    removed = []
    for image in images():
        if keep_current and image.path.name == image_name():
            continue
        image.path.unlink(missing_ok=True)
        _digest_file(image.path).unlink(missing_ok=True)
        removed.append(image)
    return removed


def mirror(sources: tuple[Path, ...] = APT_SOURCES) -> str:
    """This machine's Debian mirror for the suite, from its apt sources (one-line or deb822):
    the one place packages may come from here."""
    files = [p for source in sources if source.exists()
             for p in ([source] if source.is_file() else sorted(source.iterdir()))
             if p.is_file() and p.suffix in (".list", ".sources")]
    for path in files:
        text = path.read_text(errors="replace")
        for line in text.splitlines():  # deb [options] http://deb.debian.org/debian bookworm main
            words = re.sub(r"\[[^]]*\]", " ", line).split()
            if len(words) >= 3 and words[0] == "deb" and words[2] == SUITE:
                return words[1].rstrip("/")
        for stanza in re.split(r"\n\s*\n", text):  # Types: deb / URIs: ... / Suites: bookworm
            fields = dict(re.findall(r"^([\w-]+):[ \t]*(.*)$", stanza, re.M))
            if "deb" in fields.get("Types", "").split() and \
                    SUITE in fields.get("Suites", "").split() and fields.get("URIs"):
                return fields["URIs"].split()[0].rstrip("/")
    return DEFAULT_MIRROR


def missing_tools() -> list[str]:
    """The Debian packages whose tools booted nodes need and this machine lacks."""
    return sorted({package for tool, package in TOOLS.items() if not shutil.which(tool)})


def require_booted_host() -> None:
    """Booted nodes need root (namespaces, mounts, nspawn) and the tools: said in one line."""
    if os.geteuid() != 0:
        raise UsageError("booted local nodes need root (network namespaces, overlay mounts, "
                         "systemd-nspawn)")
    missing = missing_tools()
    if missing:
        raise UsageError(f"booted local nodes need {', '.join(missing)}: apt-get install "
                         f"{' '.join(missing)}")


def _fix_script(root: str) -> str:
    """What makes a debootstrap a cloud image that boots in a container (see the module's
    docstring): run on the host, on the tree at ``root``."""
    return f"""set -e
root={root}
sed -i 's/^# *\\({LOCALE} UTF-8\\)/\\1/' "$root/etc/locale.gen"
chroot "$root" locale-gen >/dev/null
echo 'LANG={LOCALE}' > "$root/etc/default/locale"
mkdir -p "$root/etc/cloud/cloud.cfg.d"
rm -f "$root/etc/apt/sources.list" "$root"/etc/apt/sources.list.d/*
: > "$root/etc/machine-id"
mkdir -p "$root/var/lib/dbus"
ln -sf /etc/machine-id "$root/var/lib/dbus/machine-id"
rm -f "$root"/etc/ssh/ssh_host_*
# sshd socket-activated, as Ubuntu 24.04's cloud images have it (ssh.socket enabled, the
# service not): the node's first boot must hold and release the socket too (docs/clouds.md).
chroot "$root" systemctl disable ssh.service >/dev/null 2>&1
chroot "$root" systemctl enable ssh.socket >/dev/null 2>&1
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/var/log/*.log
"""


BUILD_STAGES = ("debootstrap", "preparing the image", "packing the image")


def build_image(say: Callable[[str], None] = lambda line: None,
                stage: Callable[[int, str], None] = lambda number, line: None) -> Image:
    """Build the current image (root, Debian's tools; minutes), unless it is kept already.
    Built beside the cache under a temporary name and renamed whole: an interrupted build
    leaves no image, and two builds at once do not mix. ``stage`` hears where it is: the
    number of the stage in BUILD_STAGES and its latest line (debootstrap's `I: ...`)."""
    existing = current_image()
    if existing is not None:
        return existing
    require_booted_host()
    directory = cache_dir()
    try:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        raise UsageError(f"{CACHE_ENV}: cannot make {directory}: {exc.strerror}") from None
    if why := untrusted(directory):
        raise UsageError(f"{CACHE_ENV}: {why}: booted nodes' images are kept only in a "
                         "directory of this user's own that others cannot write to")
    target = directory / image_name()
    source = mirror()
    with tempfile.TemporaryDirectory(prefix="build-", dir=directory) as work:
        tree = Path(work) / "root"
        say(f"building the booted nodes' image from {source} (debootstrap {SUITE}; a few "
            "minutes, once)")
        started = time.monotonic()
        stage(0, "starting")
        run_tool(["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE,
                  str(tree), source], "debootstrap",
                 on_line=lambda line: stage(0, line) if line.startswith("I: ") else None)
        stage(1, "the container runtime")
        run_tool(["chroot", str(tree), "sh", "-c", "apt-get update -q && DEBIAN_FRONTEND="
                  "noninteractive apt-get install -y -q --no-install-recommends " +
                  " ".join(RUNTIME_PACKAGES)], "installing the container runtime")
        stage(1, "the fixes a cloud image has")
        run_tool(["sh", "-c", _fix_script(str(tree))], "preparing the image")
        (tree / "etc/cloud/cloud.cfg.d/90-sortie.cfg").write_text(CLOUD_CFG)
        for path, content in CONTAINER_FILES.items():
            (tree / path).parent.mkdir(parents=True, exist_ok=True)
            (tree / path).write_text(content)
        for path, capability in ID_MAP_HELPERS.items():
            (tree / path).chmod(0o755)
            os.setxattr(tree / path, "security.capability",
                        struct.pack("<5I", _FILE_CAPABILITY, 1 << capability, 0, 0, 0))
        partial = Path(work) / target.name
        stage(2, "tar and zstd")
        run_tool(["sh", "-c", f'tar -C "{tree}" --numeric-owner {TAR_XATTRS} -cf - . | '
                          f'zstd -q -T0 -3 -o "{partial}"'], "packing the image")
        with partial.open("rb") as packed:
            digest = hashlib.file_digest(packed, "sha256").hexdigest()
        _digest_file(partial).write_text(digest + "\n")
        os.replace(_digest_file(partial), _digest_file(target))  # the digest first: then
        os.replace(partial, target)  # an image is never there without it
        say(f"image built in {time.monotonic() - started:.0f} s: {target}")
    info = target.stat()
    return Image(target, info.st_size, info.st_mtime)


MAX_DIGEST_BYTES = 256


def unpack_image(image: Image, to: Path, env: dict[str, str] | None = None) -> None:
    """The image's tree at ``to`` (a cluster's shared lower layer: read-only to its nodes),
    only if the file is this user's own, not writable by others, and has the SHA-256 kept when
    it was built: read once, from one open file, hashed and then unpacked (a file swapped
    between the two is never unpacked). ``env``: the unpack's (a cluster's tag: `down` stops
    an unpack its controller, killed, left running)."""
    digest_file = _digest_file(image.path)
    if why := untrusted(cache_dir()) or untrusted(image.path) or untrusted(digest_file):
        raise SortieError(f"the booted nodes' image is not booted: {why} (`sortie images "
                          "--remove all`, then `sortie images --build`)")
    expected = digest_file.read_text(errors="replace")[:MAX_DIGEST_BYTES].strip()
    fd = os.open(image.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as packed:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise SortieError(f"{image.path} is not a regular file")
        if hashlib.file_digest(packed, "sha256").hexdigest() != expected:
            raise SortieError(f"{image.path} is not the image that was built here (its SHA-256 "
                              f"differs from {digest_file.name}): `sortie images --remove all`, "
                              "then `sortie images --build`")
        packed.seek(0)
        to.mkdir(parents=True, exist_ok=True)
        try:
            done = subprocess.run(["sh", "-c", f'zstd -q -d -c | tar -C "{to}" --numeric-owner '
                                   f"{TAR_XATTRS} -xf -"], stdin=packed, capture_output=True,
                                  text=True, timeout=BUILD_TIMEOUT_S, env=env)
        except subprocess.TimeoutExpired:
            raise SortieError(f"unpacking the image: no end after {BUILD_TIMEOUT_S:g} s") from None
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-3:]
        raise SortieError(f"unpacking the image failed (exit {done.returncode}): "
                          f"{' | '.join(tail)}"[:600])


def run_tool(command: list[str], what: str, timeout_s: float = BUILD_TIMEOUT_S,
             on_line: Callable[[str], object] | None = None) -> None:
    """A host tool the image or a node needs (debootstrap, tar, mount...); its failure is one
    line naming ``what`` with the end of what it said. ``on_line`` hears each line it prints
    as it prints it (a long build's progress)."""
    if on_line is None:
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise SortieError(f"{what}: no end after {timeout_s:g} s") from None
        code, said = done.returncode, (done.stderr or done.stdout)
    else:
        code, said = _streamed(command, what, timeout_s, on_line)
    if code != 0:
        tail = said.strip().splitlines()[-3:]
        raise SortieError(f"{what} failed (exit {code}): {' | '.join(tail)}"[:600])


def _streamed(command: list[str], what: str, timeout_s: float,
              on_line: Callable[[str], object]) -> tuple[int, str]:
    """(exit code, the last lines it said): ``command`` run with its output read line by line
    (stderr with it), each line handed to ``on_line``; killed past ``timeout_s``."""
    tail: list[str] = []
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, errors="replace") as tool:
        fired: list[bool] = []

        def overdue() -> None:
            fired.append(True)
            tool.kill()

        timer = threading.Timer(timeout_s, overdue)
        timer.start()
        try:
            for line in tool.stdout or ():
                on_line(line.rstrip())
                tail = [*tail[-9:], line]
        finally:
            timer.cancel()
        code = tool.wait()
    if fired:
        raise SortieError(f"{what}: no end after {timeout_s:g} s")
    return code, "".join(tail)
