"""A registry and a job's image on this machine, for the tests and benchmarks of jobs in images
(as `slurm_lab.py` is Slurm's): Debian's `docker-registry` on loopback, trusted over plain HTTP
the way a site trusts its own (a drop-in in ``/etc/containers/registries.conf.d/``, removed with
it), and an image with Python and the CPU torch, built with podman from the booted nodes' Debian
root file system (`sortie images --build`) and the package index this machine installs from.
The image is built and kept in a podman store of the lab's own (its own root and run root),
never the machine's: the nodes' store has only what
they pulled from the registry, so every pull the tests measure fetches for real, and teardown
leaves the machine's store as it was. An image is pushed from a copy of it in the OCI layout,
its layers compressed once and kept beside the store (`skopeo copy`, the registry's own push:
podman's push compressed the gigabyte again for every registry, 16 CPU-seconds against 1).
Root only (rootful podman, the drop-in); nothing here is
reached from outside the machine."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sortie.bootstrap.container import HYBRID_CONTROLLERS
from sortie.core.errors import last_line
from sortie.stacks.machine.loopback import free_port
from sortie.stacks.machine.node_network import REGISTRY_ADDRESS

DROP_INS = Path("/etc/containers/registries.conf.d")
TOOLS = {"podman": "podman", "docker-registry": "docker-registry", "zstd": "zstd",
         "skopeo": "skopeo"}
START_TIMEOUT_S = 20.0
TORCH = "torch==2.13.0"  # the one CPU build this machine's index has
# podman asks for more than this machine's hard limits by default (`bootstrap/container.py`)
LIMITS = ["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024"]
# What no job here reads, left out of the lab's image: torch's C++ headers and tests, its C++
# test programs and protoc (torch/bin but its shared-memory manager: 49 MB), and Debian's
# documentation (in all 13.5 k of its 35 k files, 274 MB). Every pull unpacks each file into
# a node's store and digests every byte, and on an ext4 disk a file costs more than its bytes
# (measured: a pull of the untrimmed image took 16 CPU-seconds into tmpfs, 33 on disk; one of
# the trimmed gigabyte 27 on 2026-12-02, against 1.6 to fetch it: the CPU goes on unpacking).
TRIMMED = ("/opt/venv/lib/python3*/site-packages/torch/include",
           "/opt/venv/lib/python3*/site-packages/torch/test",
           "/opt/venv/lib/python3*/site-packages/torch/bin/test_*",
           "/opt/venv/lib/python3*/site-packages/torch/bin/*Test",
           "/opt/venv/lib/python3*/site-packages/torch/bin/protoc*",
           "/usr/share/doc", "/usr/share/man", "/usr/share/locale")


def missing_tools() -> list[str]:
    """The Debian packages a lab needs that are not installed (`apt-get install` them)."""
    return [package for tool, package in TOOLS.items() if _found(tool) is None]


def _found(tool: str) -> str | None:
    """``tool`` on the PATH or in /usr/sbin (root's, which a user's PATH may lack)."""
    return shutil.which(tool, path=os.environ.get("PATH", "") + ":/usr/sbin")


_ANSWER_PROBE = """import sys, urllib.error, urllib.request
try:
    print(urllib.request.urlopen(sys.argv[1], timeout=2).status)
except urllib.error.HTTPError as refused:
    print(refused.code)
except OSError:
    print(0)
"""


class Registry:
    """`docker-registry serve` on 127.0.0.1 (or in a cluster's switch namespace), its storage in
    a directory of its own; with
    ``password_hash`` (bcrypt, as `htpasswd -B` writes it), only user ``lab`` may pull."""

    def __init__(self, root: Path, password_hash: str | None = None,
                 switch: str | None = None) -> None:
        """``switch``: a local cluster's switch namespace, where the registry listens on the
        cluster's registry address instead (`node_network.REGISTRY_ADDRESS`: its nodes reach
        it, trusted by their image; nothing outside the cluster's namespaces does)."""
        self.root, self.password_hash, self.switch = root, password_hash, switch
        self.address = REGISTRY_ADDRESS if switch else f"127.0.0.1:{free_port('127.0.0.1')}"
        self.process: subprocess.Popen[bytes] | None = None
        # Where the machine's podman is told to trust it (on loopback: the local nodes' store);
        # the cluster's own registry is trusted by its nodes' image instead.
        self.drop_in = None if switch else \
            DROP_INS / f"sortie-lab-{self.address.rsplit(':', 1)[1]}.conf"

    def start(self) -> Registry:
        (self.root / "storage").mkdir(parents=True, exist_ok=True)
        config = self.root / "config.yml"
        config.write_text(f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: "
                          f"{self.root / 'storage'}\n  delete:\n    enabled: true\n"
                          f"http:\n  addr: {self.address}\nlog:\n  level: warn\n" +
                          self._auth())
        within: list[str] = []
        if self.switch is not None:  # on the bridge's address: the nodes' way to it
            within = ["ip", "netns", "exec", self.switch]
            subprocess.run(["ip", "-n", self.switch, "addr", "replace",
                            f"{self.address.rsplit(':', 1)[0]}/24", "dev", "br0"], check=True)
            # Its loopback up too: without it the namespace cannot reach its own address.
            subprocess.run(["ip", "-n", self.switch, "link", "set", "lo", "up"], check=True)
        elif self.drop_in is not None:
            DROP_INS.mkdir(parents=True, exist_ok=True)
            self.drop_in.write_text(f'[[registry]]\nlocation = "{self.address}"\n'
                                    'insecure = true\n')
        log = (self.root / "registry.log").open("ab")
        self.process = subprocess.Popen([*within, "docker-registry", "serve", str(config)],
                                        stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._answers():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the registry did not start: {self.root / 'registry.log'}")
            time.sleep(0.1)
        return self

    def holding(self, other: Registry) -> Registry:
        """This registry (not started yet) holding what ``other`` holds: its storage linked, not
        pushed again (a push compresses the image's layers: ~10 CPU-seconds a gigabyte)."""
        self.root.mkdir(parents=True, exist_ok=True)
        subprocess.run(["cp", "-al", str(other.root / "storage"), str(self.root / "storage")],
                       check=True)
        return self

    def _auth(self) -> str:
        if self.password_hash is None:
            return ""
        users = self.root / "htpasswd"
        users.write_text(f"lab:{self.password_hash}\n")
        return f"auth:\n  htpasswd:\n    realm: sortie-lab\n    path: {users}\n"

    def _answers(self) -> bool:
        """Whether it answers its API (asking for credentials, when it has them)."""
        asked = ["ip", "netns", "exec", self.switch] if self.switch else []  # only from there
        said = subprocess.run([*asked, sys.executable, "-c", _ANSWER_PROBE,
                               f"http://{self.address}/v2/"], capture_output=True, text=True)
        return said.stdout.strip() == ("401" if self.password_hash else "200")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.drop_in is not None:
            self.drop_in.unlink(missing_ok=True)

    def __enter__(self) -> Registry:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _index_mounts() -> tuple[list[str], list[str]]:
    """(podman's -v flags, uv's flags): the package index this machine installs from (pip's
    settings, as `make install` hands them to uv), mounted where it is a directory."""
    tops: list[str] = []
    flags = ["--index-strategy", "unsafe-best-match"]
    cert = ""
    config = subprocess.run([sys.executable, "-m", "pip", "config", "list"],
                            capture_output=True, text=True, check=False).stdout
    for line in config.splitlines():
        key, _, value = line.partition("=")
        if key.endswith(".cert"):  # a site's own CA (a proxy's): uv in the build trusts it too
            cert = value.strip().strip("'\"")
        flag = next((f"--{name}" for name in ("find-links", "extra-index-url", "index-url")
                     if key.endswith(f".{name}")), "")
        for item in value.strip().strip("'\"").split() if flag else ():
            flags += [flag, item]
            path = item.removeprefix("file://")
            if path.startswith("/"):
                tops.append("/".join(path.split("/")[:3]))  # /opt/pypi/simple -> /opt/pypi
    volumes = [arg for top in dict.fromkeys(tops) for arg in ("-v", f"{top}:{top}:ro")]
    if cert and Path(cert).is_file():
        volumes += ["-v", f"{cert}:/etc/sortie-lab-ca.crt:ro"]
        flags = ["--cert", *flags]
    return volumes, flags


def runtime_flags() -> list[str]:
    """podman's runtime for a build here: runc where crun refuses this machine's cgroups, as a
    node's job chooses (`bootstrap/container.py`), else podman's own."""
    hybrid = Path(HYBRID_CONTROLLERS)
    refused = hybrid.is_file() and hybrid.read_text().strip() != ""
    return ["--runtime", "runc"] if refused and _found("runc") else []


def _tool(argv: list[str], said: str, timeout: float) -> str:
    """``argv``'s output; RuntimeError, ``said`` with its last line of errors, when it fails."""
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode:
        last = last_line(done.stderr, "no output")
        raise RuntimeError(f"{said}: {last}")
    return done.stdout.strip()


class ImageLab:
    """A podman store of the lab's own under ``root``, where the job's image is built from
    ``base`` (a Debian root file system, a `.tar.zst`: the booted nodes') without its
    packages ``dropped`` (theirs: the node's container runtime, which a job's image has no use
    for) and kept."""

    def __init__(self, root: Path, base: Path | None, dropped: tuple[str, ...] = ()) -> None:
        self.root, self.base, self.dropped = root, base, dropped

    def podman(self, *args: str, timeout: float = 600.0) -> str:
        """A podman command in the lab's store: its output; RuntimeError with its last line
        when it fails."""
        return _tool(["podman", *self.store, *args], f"podman {shlex.join(args[:3])} ...",
                     timeout)

    @property
    def store(self) -> list[str]:
        return ["--root", str(self.root / "storage"), "--runroot", str(self.root / "run")]

    def exists(self, image: str) -> bool:
        return subprocess.run(["podman", *self.store, "image", "exists", image],
                              check=False).returncode == 0

    def torch_image(self, name: str = "localhost/sortie-lab-torch:5") -> str:
        """An image with Debian's Python and the CPU torch in /opt/venv (on its PATH), built
        once and kept under ``name``; ``name``."""
        self.root.mkdir(parents=True, exist_ok=True)
        with (self.root / "build.lock").open("w") as lock:  # test workers share the store
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not self.exists(name):
                self._build(name)
        return name

    def _build(self, name: str) -> None:
        if self.base is None:
            raise RuntimeError("no base image: `sortie images --build` makes the booted nodes'")
        beside = Path(sys.executable).parent / "uv"  # the venv's, which installed sortie
        uv = str(beside) if beside.is_file() else shutil.which("uv")
        if uv is None:
            raise RuntimeError("no uv to install torch into the image with (`pip install uv`)")
        volumes, flags = _index_mounts()
        with tempfile.TemporaryDirectory(prefix="sortie-image-") as work:
            base_name = f"{name}-base"
            subprocess.run(f"zstd -dc {shlex.quote(str(self.base))} | podman "
                           f"{shlex.join(self.store)} import -q - {shlex.quote(base_name)}",
                           shell=True, check=True, stdout=subprocess.DEVNULL)
            cert = "SSL_CERT_FILE=/etc/sortie-lab-ca.crt " if "--cert" in flags else ""
            install = cert + shlex.join(["/uv", "pip", "install", "-q", "--no-cache",
                                         "--python", "/opt/venv/bin/python",
                                         *(f for f in flags if f != "--cert"), TORCH, "numpy"])
            # Bytecode compiled in the image, as NGC's ship it: without it each rank compiles
            # torch's modules again at every start (2 s more a start, measured). Checked by its
            # source's hash, not its time: a layer keeps whole seconds, and a source whose time
            # it rounded up made its .pyc stale (450 modules compiled at every start, measured).
            # (A few files are templates, not Python: compiled at import, as pip leaves them.)
            compiled = ("/opt/venv/bin/python -m compileall -q -j 0 --invalidation-mode "
                        "checked-hash /opt/venv/lib > /dev/null || true")
            drop = (f"apt-get purge -q -y --auto-remove {shlex.join(self.dropped)} > /dev/null "
                    "&& " if self.dropped else "")
            (Path(work) / "Containerfile").write_text(
                f"FROM {base_name}\nRUN {drop}python3 -m venv --without-pip /opt/venv && "
                f"{install} && rm -rf {' '.join(TRIMMED)} && {compiled}\n"
                "ENV PATH=/opt/venv/bin:$PATH\n")
            try:  # one layer: what was dropped is not in the base's either
                self.podman("build", "-q", "--squash-all", *LIMITS, *runtime_flags(),
                            "-v", f"{uv}:/uv:ro", *volumes, "-t", name, work, timeout=1200)
            finally:
                self.forget(base_name)

    def random_image(self, name: str, megabytes: int) -> str:
        """An image of one layer of ``megabytes`` of random bytes, made anew: no other image,
        nor any other test run's (a second clone's beside this one), shares a layer with it.
        ``name``; `forget` removes it."""
        with tempfile.TemporaryDirectory(prefix="sortie-image-") as work:
            with (Path(work) / "blob").open("wb") as blob:
                for _ in range(megabytes):
                    blob.write(os.urandom(1 << 20))
            (Path(work) / "Containerfile").write_text("FROM scratch\nCOPY blob /blob\n")
            self.podman("build", "-q", "-t", name, work, timeout=600)
        return name

    def forget(self, image: str) -> None:
        """``image`` removed from the lab's store and its layout, if it is there."""
        with contextlib.suppress(RuntimeError):
            shutil.rmtree(self._layout_dir(image), ignore_errors=True)
            self.podman("rmi", image)

    def push(self, image: str, registry: Registry, as_name: str) -> str:
        """``image`` pushed to ``registry`` as ``as_name`` (name:tag); its reference there."""
        remote = f"{registry.address}/{as_name}"
        _tool(["skopeo", "copy", "-q", "--dest-tls-verify=false",
               f"oci:{self._layout(image)}:image", f"docker://{remote}"],
              f"skopeo copy {image} to {remote}", 600)
        return remote

    def _layout_dir(self, image: str) -> Path:
        """Where ``image``'s OCI layout is kept: named by its ID, so a rebuilt image's is new."""
        return self.root / "layouts" / self.podman("image", "inspect", "--format", "{{.Id}}",
                                                   image)

    def _layout(self, image: str) -> Path:
        """``image`` in the OCI layout, its layers compressed (made once, under the lock the
        test workers share, and written aside before it is named)."""
        layout = self._layout_dir(image)
        layout.parent.mkdir(parents=True, exist_ok=True)
        with (self.root / "build.lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not layout.is_dir():
                aside = layout.with_name(f".{layout.name}-{os.getpid()}")
                shutil.rmtree(aside, ignore_errors=True)
                self.podman("push", "-q", image, f"oci:{aside}:image", timeout=600)
                aside.rename(layout)
        return layout
