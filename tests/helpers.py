"""What several test files share: the repository's root, the offline evaluation of a profile,
running the `sortie` command line in a child process and following its output, and the
leftover checks (processes, listeners) that look only at what a test made."""

from __future__ import annotations

import contextlib
import http.server
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import psutil
import pytest

from sortie.core.errors import SortieError
from sortie.core.progress import QuietReporter
from sortie.infra.offline import evaluate
from sortie.infra.review import Evaluation
from sortie.stacks.booted.image import missing_tools
from sortie.stacks.machine.loopback import find_sshd
from sortie.trainer.metrics import STEP_PATTERN
from tests.stack_double import DoubleCloud

REPO = Path(__file__).resolve().parent.parent


def starts_host_key_fetch(cloud_config: dict) -> bool:
    """Whether a node's cloud-config starts its host-key fetch at boot, holding sshd until the
    pinned key is in: the first boot command, never behind the rest of first boot (runcmd)."""
    from sortie.infra.cloud_init import FETCH_UNIT, HOST_KEY_SCRIPT

    first = " ".join(cloud_config["bootcmd"][0])
    # Both of sshd's units held (Ubuntu 24.04's socket too), the fetch after cloud-init's first
    # stages under their old and new names (24.3 renamed cloud-init.service).
    return ("stop ssh.socket ssh.service" in first and "mask --runtime ssh.socket ssh.service"
            in first and f"--unit={FETCH_UNIT}" in first and f"sh {HOST_KEY_SCRIPT}" in first
            and "After=cloud-init.service" in first
            and "After=cloud-init-network.service" in first
            and ["sh", HOST_KEY_SCRIPT] not in cloud_config["runcmd"])


def evaluate_profile(name: str) -> Evaluation:
    """Run a cloud program offline for a shipped profile, stacks/profiles/Pulumi.<name>.yaml."""
    from sortie.stacks.profiles import load_profile

    return evaluate(load_profile(name), name)


def evaluate_with(base: dict, stack: str = "edge", **settings) -> Evaluation:
    """Run a cloud program offline for `base` config plus `sortie:` settings."""
    return evaluate({**base, **{f"sortie:{key}": value for key, value in settings.items()}},
                    stack)


def subtrees(evaluation: Evaluation) -> dict[str, set[str]]:
    """What each kind of part (`infra/parts.py`) holds, as resource types ("" for what hangs
    directly off the cluster component), read from the parents the program declared. Asserts
    the shape on the way: one cluster component, every part directly under it, and every
    resource under the cluster or one of its parts."""
    cloud = evaluation.spec.cloud
    by_urn = {r.urn: r for r in evaluation.resources}
    (cluster,) = [r for r in evaluation.resources if r.type == f"sortie:{cloud}:GpuCluster"]
    held: dict[str, set[str]] = {}
    for resource in evaluation.resources:
        if resource is cluster:
            continue
        parent = by_urn[resource.parent]
        if resource.type.startswith("sortie:"):
            assert parent is cluster, f"part {resource.name} is not under the cluster"
            held.setdefault(resource.type.rsplit(":", 1)[-1], set())
        elif parent is cluster:
            held.setdefault("", set()).add(resource.type)
        else:
            assert parent.parent == cluster.urn, f"{resource.name} is not in a part"
            held.setdefault(parent.type.rsplit(":", 1)[-1], set()).add(resource.type)
    return held


def node_parts(evaluation: Evaluation) -> dict[str, list[str]]:
    """Each Node part's name and the types of the resources it holds."""
    nodes = {r.urn: r.name for r in evaluation.resources
             if r.type == f"sortie:{evaluation.spec.cloud}:Node"}
    held: dict[str, list[str]] = {name: [] for name in nodes.values()}
    for resource in evaluation.resources:
        if resource.parent in nodes:
            held[nodes[resource.parent]].append(resource.type)
    return held


SDK_PACKAGES = {"aws": "pulumi_aws", "gcp": "pulumi_gcp", "azure-native": "pulumi_azure_native"}


def sdk_accepts(token: str, argument: str) -> bool:
    """Whether the SDK class behind a type token takes `argument` (e.g. tags, labels)."""
    import importlib
    import inspect

    package, module_type, cls = token.split(":")
    if package not in SDK_PACKAGES:
        return False
    module = importlib.import_module(f"{SDK_PACKAGES[package]}.{module_type.split('/')[0]}")
    return argument in inspect.signature(getattr(module, cls)._internal_init).parameters


def sshd_missing() -> str | None:
    try:
        find_sshd()
    except SortieError as exc:
        return str(exc)
    return None


needs_sshd = pytest.mark.skipif(sshd_missing() is not None,
                                reason=f"real sshd needed: {sshd_missing()}")
NO_BOOT = ("booted nodes need root" if os.geteuid() != 0 else
           f"booted nodes need {', '.join(missing_tools())} (apt-get install)"
           if missing_tools() else None)
needs_boot = pytest.mark.skipif(NO_BOOT is not None, reason=str(NO_BOOT))


def child_env(extra: dict | None = None) -> dict[str, str]:
    """The environment of a CLI child: ours, without a terminal's size (pytest-xdist's workers
    pass one on; output to a pipe is as wide as its content), plus ``extra``."""
    inherited = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    return {**inherited, **(extra or {})}


def sortie(*args: str, cwd: Path, timeout: float = 300, env: dict | None = None,
           **kwargs) -> subprocess.CompletedProcess:
    """Run the real CLI in a child process, as a user would; ``env`` adds to the environment."""
    return subprocess.run([sys.executable, "-m", "sortie", *args], cwd=cwd,
                          env=child_env(env), capture_output=True, text=True,
                          timeout=timeout, **kwargs)


def cli(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    """`sortie ARGS` run in this process, as `sortie()` runs it in a child (``env`` added to the
    environment, ``cwd`` the directory): its exit code and what it printed. A unit test's way:
    no Python start and no imports again for each command (issue 63)."""
    from sortie.cli.app import main

    out, err = io.StringIO(), io.StringIO()
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(out), \
            contextlib.redirect_stderr(err):
        patch.chdir(cwd)
        for key in ("COLUMNS", "LINES"):
            patch.delenv(key, raising=False)
        for key, value in (env or {}).items():
            patch.setenv(key, value)
        try:
            code = main(list(args))
        finally:  # (`main` sets its own, for a process of its own)
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
    return subprocess.CompletedProcess(["sortie", *args], code, out.getvalue(), err.getvalue())


def start_sortie(cwd: Path, *args: str, env: dict | None = None) -> subprocess.Popen:
    """``sortie ARGS`` in a child process, its output (stderr too) on ``proc.stdout``."""
    return subprocess.Popen(
        [sys.executable, "-m", "sortie", *args], cwd=cwd, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
        # A hung controller can then be made to print every thread's stack (SIGABRT).
        env=child_env({"PYTHONPATH": str(REPO), "PYTHONFAULTHANDLER": "1", **(env or {})}))


def start_run(cwd: Path, *args: str, env: dict | None = None) -> subprocess.Popen:
    """``sortie run ARGS`` in a child process, its output (stderr too) on ``proc.stdout``."""
    return start_sortie(cwd, "run", *args, env=env)


def dead_pid() -> int:
    """The pid of a process that has exited (as a killed controller, or its Pulumi CLI)."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    return gone.pid


def stop(proc: subprocess.Popen, grace: float = 60) -> None:
    """``proc`` ended: SIGTERM, then SIGKILL if it is still running ``grace`` seconds later (on
    a loaded machine, two clones' tests side by side, Azurite took more than ten to end)."""
    proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def busy_machine(burners: int) -> Iterator[None]:
    """Inside: a machine whose CPUs are all in use, as a test of behaviour under load needs.
    ``burners`` processes spinning, unless the machine is that busy already (its one-minute
    load average at its core count or above: the suite's other tests, in CI, where burners
    would only take CPU from them: ~30 CPU-seconds a run)."""
    if os.getloadavg()[0] >= (os.cpu_count() or 1):
        yield
        return
    spinning = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                for _ in range(burners)]
    try:
        yield
    finally:
        for burner in spinning:
            burner.kill()
            burner.wait()


def controller_output(seen: list[str]) -> str:
    """The controller's own lines, without the nodes' streamed output."""
    return "".join(line for line in seen if not line.startswith("node-"))


# follow_until's reader of each process, which exit_code lets finish
_READERS: weakref.WeakKeyDictionary[subprocess.Popen, threading.Thread] = \
    weakref.WeakKeyDictionary()


def exit_code(proc: subprocess.Popen, seen: list[str], timeout: float) -> int:
    """``proc``'s exit code; if it is still running after ``timeout``, the test fails with
    the stacks of all its threads (faulthandler), which is what a hang needs to be understood."""
    try:
        code = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)
        proc.wait(10)
        _last_lines_read(proc)
        pytest.fail(f"still running {timeout:.0f}s later; its output without node lines:\n"
                    f"{controller_output(seen)[-12000:]}")
    _last_lines_read(proc)
    return code


def _last_lines_read(proc: subprocess.Popen) -> None:
    """Wait for follow_until's reader to take what an ended ``proc`` left in the pipe: without it a
    test reading the last line read the one before (a CI run's "✗ Bootstrapping nodes" where the
    interrupted line came next)."""
    reader = _READERS.get(proc)
    if reader is not None:
        reader.join(10)


T = TypeVar("T")


def wait_until(done: Callable[[], T], timeout: float, failure: str | Callable[[], object] = "",
               pause: float = 0.5) -> T:
    """Ask ``done`` every ``pause`` seconds until it answers something true, and return that; the
    test fails, saying ``failure`` (or what it returns), once ``timeout`` seconds have passed (a
    deadline on a condition, never a fixed sleep)."""
    deadline = time.monotonic() + timeout
    while not (answer := done()):
        assert time.monotonic() < deadline, failure if isinstance(failure, str) else failure()
        time.sleep(pause)
    return answer


def follow_until(proc: subprocess.Popen, seen: list[str], started: Callable[[str], bool],
                 timeout: float = 120) -> threading.Thread:
    """Collect ``proc``'s output lines into ``seen`` from a background thread; return that thread
    once a line satisfies ``started`` (the test fails if none does within ``timeout``, or once
    ``proc``'s output ends without one)."""
    matched = threading.Event()

    def read() -> None:
        try:
            for line in proc.stdout:
                seen.append(line)
                if started(line):
                    matched.set()
        finally:
            matched.set()  # its output ended: no line will match from now on

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    _READERS[proc] = reader
    assert matched.wait(timeout) and any(started(line) for line in list(seen)), \
        "never started:\n" + "".join(seen)[-3000:]
    return reader


def reached_step(at_least: int) -> Callable[[str], bool]:
    """A line test for `follow_until`: the trainer reported step ``at_least`` or later."""
    def check(line: str) -> bool:
        match = STEP_PATTERN.search(line)
        return bool(match) and int(match.group(1)) >= at_least
    return check


def assert_nothing_left(sortie_home: Path, listeners_before: set | None = None,
                        cloud: DoubleCloud | None = None, name: str | None = None) -> None:
    """After a sortie: no process, no listener (beyond ``listeners_before``), no state
    directory of its cluster; on the stack double, no resource and no stack either."""
    assert processes_mentioning(sortie_home) == []
    if listeners_before is not None:  # only this test's: another run may share the machine
        assert owned_listeners(loopback_listeners() - listeners_before, sortie_home) == set(), \
            "a node still listens"
    clusters = sortie_home / "clusters"
    assert not clusters.exists() or not any(clusters.iterdir()), "state directory left behind"
    if cloud is not None:
        assert cloud.resources == {}, "the cloud still has resources"
        assert name not in cloud.stacks, "the stack was not removed"
        assert not (sortie_home / "stacks" / str(name)).exists(), "controller state left behind"


class Recorder(QuietReporter):
    """A reporter that keeps what it was told; ``on_line`` may act on a node's output."""

    def __init__(self, on_line: Callable[[str, str], None] | None = None) -> None:
        super().__init__()
        self.lines: list[str] = []
        self.on_line = on_line

    def node_line(self, node: str, line: str) -> None:
        self.lines.append(f"{node} | {line}")
        if self.on_line:
            self.on_line(node, line)


def processes_mentioning(path: Path) -> list[str]:
    """Live processes whose command line or working directory is under ``path``."""
    marker, found = f"{path}/", []
    for proc in psutil.process_iter(["cmdline", "cwd", "status"]):
        if proc.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        cmdline = " ".join(proc.info["cmdline"] or [])
        if marker in cmdline or f"{proc.info['cwd'] or ''}/".startswith(marker):
            found.append(f"{proc.pid} {cmdline}")
    return found


def loopback_listeners() -> set[tuple[str, int]]:
    """TCP sockets listening on loopback, where local nodes and their rendezvous live."""
    return {(c.laddr.ip, c.laddr.port) for c in psutil.net_connections(kind="tcp")
            if c.status == psutil.CONN_LISTEN and c.laddr.ip.startswith("127.")}


def owned_listeners(listeners: set[tuple[str, int]], path: Path) -> set[tuple[str, int]]:
    """Of ``listeners``, those whose process runs from ``path`` or names it (a test's own
    nodes). A second test run, or a user's sortie, on the same machine is not this test's
    leftover."""
    marker, owned = f"{path}/", set()
    by_address = {(c.laddr.ip, c.laddr.port): c.pid for c in psutil.net_connections(kind="tcp")
                  if c.status == psutil.CONN_LISTEN}
    for address in listeners & by_address.keys():
        try:  # (no pid without root: whose it is cannot be told, and processes_mentioning
            # has already looked for this test's processes)
            process = psutil.Process(by_address[address] or -1)
            cmdline, cwd = " ".join(process.cmdline()), f"{process.cwd()}/"
        except (psutil.Error, ValueError):
            continue  # gone since, or not ours to read
        if marker in cmdline or cwd.startswith(marker):
            owned.add(address)
    return owned


class CloudMetadata(http.server.BaseHTTPRequestHandler):
    """Answers like AWS IMDSv2, GCP's metadata server and Azure Scheduled Events, and checks the
    headers each one demands."""

    preempted = False
    token_requests = 0  # IMDSv2 session tokens handed out
    maintenance = "NONE"  # GCP's maintenance-event
    vm_name = "sortie-vm-0"  # Azure: this VM, as Scheduled Events' Resources name it
    azure_events: list[dict] = []  # further Scheduled Events
    too_many = 0  # the next this many Scheduled Events requests answer 429

    def do_PUT(self) -> None:  # noqa: N802 - http.server's naming
        ok = self.path == "/latest/api/token" and self.headers.get(
            "X-aws-ec2-metadata-token-ttl-seconds")
        CloudMetadata.token_requests += 1
        self._reply(200 if ok else 400, b"aws-token")

    def do_GET(self) -> None:  # noqa: N802
        if self.path == "/latest/meta-data/spot/instance-action":
            if self.headers.get("X-aws-ec2-metadata-token") != "aws-token":
                return self._reply(401, b"")
            return self._reply(200 if self.preempted else 404, b'{"action": "terminate"}')
        if self.path == "/computeMetadata/v1/instance/preempted":
            if self.headers.get("Metadata-Flavor") != "Google":
                return self._reply(403, b"")
            return self._reply(200, b"TRUE" if self.preempted else b"FALSE")
        if self.path == "/computeMetadata/v1/instance/maintenance-event":
            if self.headers.get("Metadata-Flavor") != "Google":
                return self._reply(403, b"")
            return self._reply(200, self.maintenance.encode())
        if self.headers.get("Metadata") != "true" and self.path.startswith("/metadata/"):
            return self._reply(400, b"")
        if self.path == "/metadata/instance/compute/name?api-version=2021-02-01&format=text":
            return self._reply(200, self.vm_name.encode())
        if self.path == "/metadata/scheduledevents?api-version=2020-07-01":
            if self.too_many:  # past IMDS's rate
                CloudMetadata.too_many -= 1
                return self._reply(429, b"")
            # Another VM's freeze is never this one's notice; its own events are.
            events = [{"EventId": "e0", "EventType": "Freeze", "Resources": ["other-vm"]},
                      *self.azure_events]
            if self.preempted:
                events.append({"EventId": "e1", "EventType": "Preempt",
                               "Resources": [self.vm_name]})
            return self._reply(200, json.dumps({"Events": events}).encode())
        return self._reply(404, b"")

    def _reply(self, code: int, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args) -> None:
        pass


def _copy_sources(to: Path) -> Path:
    """What the wheel is built from, copied: building in the checkout would leave build/."""
    to.mkdir(parents=True)
    keep = ("pyproject.toml", "README.md", "sortie", "infra", "stacks", "bootstrap", "trainer")
    for name in keep:
        source = REPO / name
        if source.is_dir():  # sortie/'s links to the folders kept as links
            shutil.copytree(source, to / name, symlinks=True,
                            ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, to / name)
    return to


def site_of(venv: Path) -> str:
    """A virtualenv's site-packages."""
    return subprocess.run([venv / "bin" / "python", "-c", "import sysconfig; "
                           "print(sysconfig.get_path('purelib'))"],
                          capture_output=True, text=True, check=True).stdout.strip()


def install_wheel_alone(tmp_path: Path) -> tuple[Path, Path]:
    """sortie's wheel, built from a copy of the sources, installed alone into a fresh virtualenv
    (its dependencies from this one's site-packages, never the checkout), with the `sortie`
    script pip would write: (the virtualenv, the wheel)."""
    sources = _copy_sources(tmp_path / "src")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--no-build-isolation", "-w", str(tmp_path / "dist"), str(sources)],
                   check=True, timeout=300, capture_output=True)
    (wheel,) = (tmp_path / "dist").glob("sortie-*.whl")
    fresh = tmp_path / "fresh"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(fresh)], check=True,
                   timeout=120)
    site = site_of(fresh)
    # Dependencies from here: a plain path (not a site dir) runs none of its .pth files, so the
    # editable install's path to the checkout stays out.
    (Path(site) / "deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", site,
                    str(wheel)], check=True, timeout=300, capture_output=True)
    python = fresh / "bin" / "python"
    script = f"#!{python}\nfrom sortie.cli.start import entry\nentry()\n"  # as pip writes it
    (fresh / "bin" / "sortie").write_text(script)
    (fresh / "bin" / "sortie").chmod(0o755)
    return fresh, wheel
