"""Shared fixtures. SSH tests run against real OpenSSH daemons that the tests start themselves."""

from __future__ import annotations

import http.server
import os
import platform
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from sortie.stacks.local.local_backend import LocalBackend
from sortie.stacks.machine.image_lab import Registry
from sortie.stacks.machine.loopback import alive_now
from tests.helpers import CloudMetadata

# The test modules as pytest rewrites them (its asserts), cached in tests/__pycache__ even where
# the environment sets PYTHONDONTWRITEBYTECODE (as this one does): each test process otherwise
# rewrote and compiled every module again, 2.7 of its 5.8 CPU-seconds of collection. Only this
# process: the commands and jobs the tests start still write nothing.
sys.dont_write_bytecode = False

# A shell starts background jobs with SIGINT ignored, and children inherit that: the Ctrl-C
# tests would then test nothing. Sortie run by hand in the background rightly keeps ignoring it.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test is either `unit` or `e2e` (its module's `pytestmark`), so that `pytest -m unit`
    runs the fast half and nothing falls between the two."""
    unmarked = [item.nodeid for item in items
                if sum(bool(item.get_closest_marker(kind)) for kind in ("unit", "e2e")) != 1]
    if unmarked:
        raise pytest.UsageError(f"mark these tests unit or e2e: {', '.join(unmarked)}")


@pytest.fixture(autouse=True)
def _a_unit_test_starts_no_process(request: pytest.FixtureRequest,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """What the `unit` mark promises, held (issue 63: unit tests started the CLI, shells and
    Pythons, and the quick half took five minutes): a unit test that starts a process fails."""
    if request.node.get_closest_marker("unit") is None:
        return
    # The standard library runs `uname -p` once per process, on the first platform.platform()
    # (Azure's SDK asks it for its user agent): run before the guard, not in whichever test
    # comes first (a unit test passed or failed by what ran before it).
    platform.processor()

    def refused(*args: object, **kwargs: object) -> None:
        raise AssertionError("a unit test started a process: test it in-process, or mark it e2e")
    monkeypatch.setattr(subprocess.Popen, "_execute_child", refused)
    monkeypatch.setattr(os, "posix_spawn", refused)
    monkeypatch.setattr(os, "fork", refused)


@pytest.fixture
def aws_endpoint(monkeypatch: pytest.MonkeyPatch) -> str:
    """A real AWS API server (moto) on loopback, with the environment pointing boto3 at it.
    fsspec keeps one S3 file system per set of arguments, whatever the environment says now:
    one made for an earlier test's server (since stopped) would be handed out again."""
    import s3fs
    from moto.server import ThreadedMotoServer

    from sortie.stacks.machine.loopback import free_port

    s3fs.S3FileSystem.clear_instance_cache()
    port = free_port("127.0.0.1")
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                        "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": endpoint}.items():
        monkeypatch.setenv(name, value)
    yield endpoint
    server.stop()
    s3fs.S3FileSystem.clear_instance_cache()


@pytest.fixture
def own_profiles(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The shipped profiles as a user's own ($SORTIE_PROFILES), each with a real SSH source in
    place of the documentation placeholder that `sortie run --stack` refuses, and the egress
    check off (the stack double's nodes are reached over loopback)."""
    from sortie.stacks.profiles import PROFILES_DIR

    mine = tmp_path / "profiles"
    mine.mkdir()
    for shipped in PROFILES_DIR.glob("Pulumi.*.yaml"):
        text = shipped.read_text().replace("198.51.100.7/32", "100.64.7.0/24")
        (mine / shipped.name).write_text(text)
    monkeypatch.setenv("SORTIE_PROFILES", str(mine))
    monkeypatch.setenv("SORTIE_EGRESS_URL", "off")
    return mine


@pytest.fixture
def sortie_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private SORTIE_HOME so that tests never see each other's or the user's clusters."""
    home = tmp_path / "sortie-home"
    monkeypatch.setenv("SORTIE_HOME", str(home))
    return home


def _tear_down_clusters_under(root: Path) -> list[str]:
    """Tear down every local cluster in any sortie home under ``root`` (the tests' homes, the
    stack double's machines); returns what could not be proven gone."""
    left = []
    for clusters in root.glob("**/clusters"):
        if clusters.is_dir() and not clusters.is_symlink():
            machines = LocalBackend(clusters.parent)
            for cluster_id in machines.cluster_ids():
                report = machines.down(cluster_id)
                left += [f"{cluster_id}: {leftover.kind} {leftover.resource}"
                         for leftover in report.leftovers]
    return left


@pytest.fixture(scope="session")
def lab_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    """A registry on loopback for the whole test process (`tests/test_images.py::registry`
    asks for it): each module's tests pushing the lab's torch image to a registry of its own
    compressed the image's gigabyte again each time (~15 CPU-seconds); a second push of it to
    the same registry, under any name, sends nothing."""
    with Registry(tmp_path_factory.mktemp("registry")) as started:
        yield started


PASSED = pytest.StashKey[bool]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]
                              ) -> Iterator[pytest.TestReport]:
    report = yield
    if report.when == "call":
        item.stash[PASSED] = report.passed
    return report


@pytest.fixture(autouse=True)
def _no_clusters_left(request: pytest.FixtureRequest):
    """Whatever a test's outcome, the local clusters it made (real sshd daemons, network
    namespaces) are torn down when it ends: a test that fails half-way leaves nothing. A test
    that passed leaves no files either (`make test` keeps them in memory: see the Makefile),
    unless something is still mounted in its directory (then it is not touched)."""
    yield
    tmp_path = (request.node.funcargs or {}).get("tmp_path")
    if tmp_path is None:
        return
    left = _tear_down_clusters_under(tmp_path)
    if request.node.stash.get(PASSED, False) and not left and not _mounts_under(tmp_path):
        shutil.rmtree(tmp_path, ignore_errors=True)


def _mounts_under(root: Path) -> list[str]:
    """This namespace's mount points in ``root`` (a booted node's bind mounts are the
    machine's directories: removing through one would remove them)."""
    with open("/proc/self/mounts") as mounts:
        points = [line.split()[1].replace("\\040", " ") for line in mounts]
    return [point for point in points if point.startswith(f"{root}/")]


@pytest.fixture(autouse=True, scope="session")
def _the_suite_leaves_nothing(tmp_path_factory: pytest.TempPathFactory):
    """At the end, nothing of this run's own remains: no cluster state, no process started in
    or naming its temporary directories (sshd daemons, watchdogs, jobs), no namespace."""
    root = tmp_path_factory.getbasetemp()
    yield
    left = _tear_down_clusters_under(root)
    mine = [p for p in psutil.process_iter(["cmdline"]) if p.pid != os.getpid() and
            f"{root}/" in " ".join(p.info["cmdline"] or []) and alive_now(p)]
    for proc in mine:
        proc.kill()
    left += [f"process {p.pid}: {' '.join(p.info['cmdline'])[:200]}" for p in mine]
    if left:
        pytest.fail("the test run left behind: " + "; ".join(left), pytrace=False)


@pytest.fixture
def backend(sortie_home: Path) -> LocalBackend:
    local = LocalBackend(sortie_home)
    yield local
    for cluster_id in local.cluster_ids():  # never leak daemons, even when a test fails
        local.down(cluster_id)


@pytest.fixture
def metadata():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), CloudMetadata)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    CloudMetadata.preempted, CloudMetadata.token_requests = False, 0
    CloudMetadata.maintenance, CloudMetadata.azure_events, CloudMetadata.too_many = "NONE", [], 0
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
