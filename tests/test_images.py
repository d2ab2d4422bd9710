"""Jobs in a container image, for real: a registry on loopback (Debian's docker-registry), an
image with Python and the CPU torch built by podman (`stacks/machine/image_lab.py`), pushed,
and pulled by local nodes with rootful podman; runs of a user's script and of the bundled
trainer in it, a setup cached per image, a lost node, pulls that fail, and nothing left."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from sortie.stacks.booted.image import RUNTIME_PACKAGES, cache_dir, current_image
from sortie.stacks.local.local_backend import LocalBackend
from sortie.stacks.machine.image_lab import ImageLab, Registry, missing_tools
from tests.helpers import (
    assert_nothing_left,
    controller_output,
    exit_code,
    follow_until,
    needs_sshd,
    reached_step,
    sortie,
    start_run,
    start_sortie,
)
from tests.test_attach import Lab
from tests.test_attach import lab as hosts_to_attach  # noqa: F401 (a fixture: sshd "hosts")

pytestmark = [pytest.mark.e2e, needs_sshd]
# The job's image, built from the booted nodes' Debian and kept beside their image's cache.
BASE = current_image()
LAB = ImageLab(cache_dir().parent / "image-lab", BASE.path if BASE else None, RUNTIME_PACKAGES)

SCRIPT = """\
import os, sys, torch, torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank(); total = torch.ones(1) * rank; dist.all_reduce(total)
made = os.path.exists("/opt/made-by-setup")
print(f"rank {rank} python {sys.prefix} sum {total.item():g} token {os.environ.get('TOKEN')} "
      f"setup {made}", flush=True)
if rank == 0:
    os.makedirs("outputs", exist_ok=True)
    with open("outputs/model.pt", "w") as f:
        f.write("weights")
dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def registry(request: pytest.FixtureRequest) -> Registry:
    """The test process's registry on loopback (`lab_registry`), once the lab's image is built."""
    if os.geteuid() != 0:
        pytest.skip("jobs in images run with rootful podman: root only")
    missing = missing_tools() + ([] if BASE else ["the booted nodes' image"])
    if missing:
        pytest.skip(f"missing: {', '.join(missing)} (`make test` installs them as root)")
    LAB.torch_image()
    return request.getfixturevalue("lab_registry")


def node_images() -> str:
    """The machine's podman store (the local nodes'), as `podman images` lists it. Asked again
    when the listing fails: another controller's `rmi` at the same moment (a second clone's
    tests, side by side) made it exit 125 once, an image gone between its read and its look."""
    deadline = time.monotonic() + 60
    while True:
        listed = subprocess.run(["podman", "images", "--format", "{{.Repository}}:{{.Tag}}"],
                                capture_output=True, text=True)
        if listed.returncode == 0 or time.monotonic() > deadline:
            listed.check_returncode()
            return listed.stdout
        time.sleep(0.5)


def used_by_another(image: str) -> bool:
    """Whether a container still uses ``image``'s content (a second clone's tests beside this
    one push the same bytes to their own registry: one image, two names): a teardown keeps an
    image in use, and says so, as it should on a shared host."""
    found = subprocess.run(["podman", "image", "inspect", "--format", "{{.Id}}", image],
                           capture_output=True, text=True)
    return found.returncode == 0 and subprocess.run(
        ["podman", "ps", "-aq", "--filter", f"ancestor={found.stdout.strip()}"],
        capture_output=True, text=True).stdout.strip() != ""


def sortie_containers(cluster: str, within: Path) -> str:
    """The containers of ``cluster`` whose nodes' workdirs are ``within`` this test's
    directories: another test's, or another controller's cluster of the same name (a second
    clone's `make test` beside this one), may run beside it."""
    listed = subprocess.run(["podman", "ps", "-a", "--filter", f"label=sortie.cluster={cluster}",
                             "--format", '{{.Names}} {{index .Labels "sortie.workdir"}}'],
                            capture_output=True, text=True, check=True).stdout
    return " ".join(name for name, _, workdir in (line.partition(" ") for line in
                                                  listed.splitlines())
                    if workdir.startswith(str(within)))


def workdir(tmp_path: Path) -> Path:
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text(SCRIPT)
    return code


@pytest.mark.timeout(900)
def test_a_script_runs_in_the_image_pinned_by_digest_and_leaves_nothing(
        registry: Registry, sortie_home: Path, tmp_path: Path):
    image = LAB.push(LAB.torch_image(), registry, "torch-script:1")
    run = sortie("run", "--nodes", "2", "-p", "2", "--workdir", str(workdir(tmp_path)),
                 "--script", "train.py", "--image", image, "--name", "inimage",
                 cwd=tmp_path, env={"TOKEN": "not-passed"}, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    out = " ".join(run.stdout.split())
    # Every rank ran in the image's Python (its venv), not the node's.
    for rank in range(4):
        assert f"rank {rank} python /opt/venv sum 6" in out, out[-3000:]
    assert f"Pulling {image} on 2 nodes" in out
    # The runtime's own helpers (conmon) are not the job's leftovers to end.
    assert "the job left" not in out, out[-3000:]
    # The runtime's progress, as it came (before: minutes of a spinner for a large image).
    pulled = [line for line in run.stdout.splitlines() if " pull | " in line]
    assert any("Copying blob" in line for line in pulled), run.stdout[-3000:]
    record = json.loads((tmp_path / "runs" / "inimage" / "run.json").read_text())
    used = record["result"]["image"]
    assert used["asked"] == image and used["runtime"] == "podman"
    assert used["image"].startswith(image.rsplit(":", 1)[0] + "@sha256:")
    assert used["size_bytes"] > 500_000_000 and set(used["pulled_s"]) == {"node-0", "node-1"}
    report = (tmp_path / "runs" / "inimage" / "report.html").read_text()
    assert 'id="image"' in report and used["image"] in report and "node-1 " in report
    # A re-run of the recorded task runs the same digest, whatever the tag names by then.
    task = (tmp_path / "runs" / "inimage" / "task.yaml").read_text()
    assert f"image: {used['image']}" in task
    # What the job wrote in its workdir is kept.
    assert (tmp_path / "runs" / "inimage" / "artifacts" / "outputs" / "model.pt").read_text() \
        == "weights"
    # Nothing left: no container, no image sortie pulled, no cluster.
    assert sortie_containers("inimage", sortie_home) == ""
    assert image.rsplit(":", 1)[0] not in node_images() or used_by_another(image)
    assert_nothing_left(sortie_home)


@pytest.mark.timeout(1200)
def test_setup_runs_in_the_image_once_per_digest_and_exec_reuses_it(
        registry: Registry, sortie_home: Path, tmp_path: Path):
    image = LAB.push(LAB.torch_image(), registry, "torch-setup:1")
    code = workdir(tmp_path)
    (code / "task.yaml").write_text(
        "workdir: .\nscript: train.py\nsetup: touch /opt/made-by-setup && echo set up\n"
        f"image: {image}\nsecrets: [TOKEN]\n")
    up = sortie("up", "--nodes", "2", "--name", "held", cwd=tmp_path, timeout=300)
    assert up.returncode == 0, up.stdout[-2000:] + up.stderr[-2000:]
    try:
        first = sortie("exec", "held", str(code / "task.yaml"), cwd=tmp_path,
                       env={"TOKEN": "s3cret"}, timeout=600)
        assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-2000:]
        out = " ".join(first.stdout.split())
        assert "setup ran on node-0, node-1" in out
        # The job ran in what the setup made of the image; the secret reached it by name.
        assert "rank 0 python /opt/venv sum 1 token s3cret setup True" in out, out[-3000:]
        second = sortie("exec", "held", str(code / "task.yaml"), cwd=tmp_path,
                        env={"TOKEN": "s3cret"}, timeout=600)
        assert second.returncode == 0, second.stdout[-3000:]
        out = " ".join(second.stdout.split())
        assert "setup cached on node-0, node-1" in out and "already on node-0, node-1" in out
        assert "setup True" in out
        assert "s3cret" not in (tmp_path / "runs").joinpath(
            next(p.name for p in (tmp_path / "runs").iterdir()), "task.yaml").read_text()
        # Interrupted while its setup runs in the image: the setup's container is stopped and
        # gone from the held cluster, which stays (before: not tried end to end).
        (code / "slow.yaml").write_text("workdir: .\nscript: train.py\nsetup: echo setting "
                                        f"up; sleep 300\nimage: {image}\n")
        slow = start_sortie(tmp_path, "exec", "held", str(code / "slow.yaml"))
        seen: list[str] = []
        reader = follow_until(slow, seen, lambda line: "setup | setting up" in line, 300)
        slow.send_signal(signal.SIGINT)
        assert exit_code(slow, seen, 120) == 130, controller_output(seen)[-3000:]
        reader.join(30)
        assert sortie_containers("held", sortie_home) == "", controller_output(seen)[-3000:]
        # What this cluster's setup made, as its nodes listed it (another controller's setup
        # images may be on the machine beside it: a second clone's tests)
        made = {line.split()[1] for listing in sortie_home.glob(
            "clusters/held/nodes/*/disk/nodes/*/images") for line in listing.read_text()
            .splitlines() if "sortie-setup" in line}
        assert made, "the setup's image is listed for the teardown"
    finally:
        down = sortie("down", "held", cwd=tmp_path, timeout=300)
    assert down.returncode == 0, down.stdout + down.stderr
    assert sortie_containers("held", sortie_home) == ""
    images = node_images()
    assert not any(name.removeprefix("localhost/") in images for name in made)
    assert image.rsplit(":", 1)[0] not in images
    # Nor what one node's commit of the setup left untagged when the other's took its name.
    for key in (name.rsplit(":", 1)[1] for name in made):
        assert subprocess.run(["podman", "images", "-q", "--filter", "dangling=true", "--filter",
                               f"label=sortie.setup={key}"], capture_output=True, text=True,
                              check=True).stdout.strip() == ""
    assert_nothing_left(sortie_home)


def test_the_bundled_trainer_in_the_image_resumes_after_a_lost_node(
        registry: Registry, sortie_home: Path, tmp_path: Path):
    image = LAB.push(LAB.torch_image(), registry, "torch-trainer:1")
    proc = start_run(tmp_path, "--nodes", "2", "-p", "2", "--steps", "100", "--ckpt-every",
                     "10", "--image", image, "--name", "imgrec", "--", "--log-every", "10")
    seen: list[str] = []
    reader = follow_until(proc, seen, reached_step(30))
    # The job as a controller taking over would relaunch it: in the image, by digest.
    recorded = LocalBackend(sortie_home).load_job("imgrec")
    assert recorded is not None and recorded.image and "@sha256:" in recorded.image
    # The head: the node that pulled the image for both (they share this machine's store).
    killed = LocalBackend(sortie_home).reclaim("imgrec", "node-0")
    assert killed, "node-0 had processes to kill"
    assert exit_code(proc, seen, 300) == 0, "".join(seen)[-4000:]
    reader.join(10)
    output = " ".join("".join(seen).split())
    assert "Recovering from machine gone: replacing node-0" in output
    summary = json.loads((tmp_path / "runs" / "imgrec" / "artifacts" / "summary.json")
                         .read_text())
    assert summary["steps"] == 100 and summary["resumed_from"] >= 10
    used = json.loads((tmp_path / "runs" / "imgrec" / "run.json").read_text())["result"]["image"]
    assert "@sha256:" in used["image"]
    assert sortie_containers("imgrec", sortie_home) == ""
    # This registry's image (the store is the machine's: a second clone's tests pull their
    # own registry's torch-trainer beside it).
    assert f"{registry.address}/torch-trainer" not in node_images()
    assert_nothing_left(sortie_home)


@pytest.mark.timeout(900)
def test_pulls_that_fail_are_one_line_naming_the_image_and_the_node(
        registry: Registry, sortie_home: Path, tmp_path: Path):
    missing = f"{registry.address}/no-such-image:1"
    run = sortie("run", "--nodes", "2", "--image", missing, "--name", "nopull", "--workdir",
                 str(workdir(tmp_path)), "--script", "train.py", cwd=tmp_path, timeout=300)
    assert run.returncode == 1, run.stdout[-2000:]
    said = " ".join((run.stdout + run.stderr).split())
    assert f"node-0: pulling {missing} failed: no such image in its registry" in said, said
    assert "Traceback" not in said
    # The run's record (a user's job keeps its code in it) and report say the same (before:
    # "training failed on every node").
    recorded = json.loads((tmp_path / "runs" / "nopull" / "run.json").read_text())["failure"]
    assert recorded.startswith(f"node-0: pulling {missing} failed: no such image"), recorded
    assert "training failed" not in (tmp_path / "runs" / "nopull" / "report.html").read_text()
    assert_nothing_left(sortie_home)
    # A registry that is not there (never started: its port answers nothing; its tag is
    # resolved on the head first, so nothing need have been pushed to it).
    image = f"{Registry(tmp_path / 'gone').address}/torch:1"
    started = time.monotonic()
    run = sortie("run", "--nodes", "2", "--image", image, "--name", "noreg", cwd=tmp_path,
                 timeout=300)
    assert run.returncode == 1
    said = " ".join((run.stdout + run.stderr).split())
    assert f"pulling {image} failed: the registry could not be reached" in said, said
    assert time.monotonic() - started < 120
    # A registry that stops answering while the nodes pull from it: an image of its own
    # (random bytes, made anew), none of whose layers the machine may have already (another
    # test's, or a second clone's beside this one: the pull would need only its manifest).
    fresh = LAB.random_image(f"localhost/sortie-lab-random:{os.getpid()}", 128)
    try:
        held = LAB.push(fresh, registry, "random-mid:1")
    finally:
        LAB.forget(fresh)
    mid = Registry(tmp_path / "mid").holding(registry).start()
    try:
        image = held.replace(registry.address, mid.address)
        proc = start_run(tmp_path, "--nodes", "2", "--image", image, "--name", "midpull")
        seen: list[str] = []
        reader = follow_until(proc, seen, lambda line: True)
        # Its first blob served (the small config; the layers still come): the registry goes.
        log, deadline = tmp_path / "mid" / "registry.log", time.monotonic() + 180
        while "/blobs/sha256:" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        mid.stop()
        assert exit_code(proc, seen, 300) == 1, "".join(seen)[-3000:]
        reader.join(10)
    finally:
        mid.stop()
    said = " ".join("".join(seen).split())
    assert f"pulling {image} failed: the registry could not be reached or stopped answering" \
        in said, said[-2000:]
    assert_nothing_left(sortie_home)
    # A registry that asks for credentials the nodes do not have.
    crypt = pytest.importorskip("crypt", reason="bcrypt for the registry's users: Python's crypt")
    with Registry(tmp_path / "private", crypt.crypt("pw", crypt.mksalt(crypt.METHOD_BLOWFISH))) \
            as private:
        locked = f"{private.address}/team/train:1"
        run = sortie("run", "--nodes", "2", "--image", locked, "--name", "denied", cwd=tmp_path,
                     timeout=300)
    assert run.returncode == 1
    said = " ".join((run.stdout + run.stderr).split())
    assert f"pulling {locked} failed: the registry denied the pull" in said, said
    # A bad reference is refused before anything starts.
    bad = sortie("run", "--image", "Not An Image", cwd=tmp_path)
    assert bad.returncode == 2 and bad.stderr.count("\n") <= 1 and "--image" in bad.stderr, \
        bad.stderr
    assert_nothing_left(sortie_home)


@pytest.mark.timeout(900)
def test_attached_hosts_run_the_image_with_their_own_runtime_and_keep_what_they_pulled(
        registry: Registry, request: pytest.FixtureRequest, sortie_home: Path, tmp_path: Path):
    """Hosts sortie did not make: the job runs in the image with the runtime they have; what
    sortie pulled there stays theirs (never removed), and nothing of its job does."""
    image = LAB.push(LAB.torch_image(), registry, "torch-attached:1")
    lab: Lab = request.getfixturevalue("hosts_to_attach")
    attached = sortie("attach", "hosts", "--hosts", str(lab.hosts_file(tmp_path / "h.yaml")),
                      cwd=tmp_path)
    assert attached.returncode == 0, attached.stdout + attached.stderr
    try:
        run = sortie("exec", "hosts", "--workdir", str(workdir(tmp_path)), "--script",
                     "train.py", "--image", image, "--name", "onhosts", cwd=tmp_path,
                     timeout=600)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
        out = " ".join(run.stdout.split())
        assert "rank 0 python /opt/venv sum 1" in out and "rank 1 python /opt/venv" in out
        down = sortie("down", "hosts", cwd=tmp_path)
        assert down.returncode == 0, down.stdout + down.stderr
        assert image in node_images().replace("localhost/", ""), "the hosts keep what they pulled"
        assert sortie_containers("hosts", tmp_path) == ""
    finally:
        subprocess.run(["podman", "rmi", image], capture_output=True)


def test_a_teardown_removes_its_own_containers_never_another_controllers_of_the_same_name(
        registry: Registry, tmp_path: Path):
    """Two controllers on one machine (two users, or a second clone's tests) may each have a
    cluster named "inimage": one's teardown removed the other's running containers (by the
    cluster's label alone), and the other's job died of SIGTERM."""
    from sortie.bootstrap.container import removal_script

    context = tmp_path / "image"
    context.mkdir()
    (context / "Containerfile").write_text("FROM scratch\nCOPY blob /blob\n")
    (context / "blob").write_bytes(os.urandom(1024))
    image = f"localhost/sortie-test-labels:{os.getpid()}"
    subprocess.run(["podman", "build", "-q", "-t", image, str(context)], check=True,
                   capture_output=True)
    mine, theirs = tmp_path / "mine" / "disk", tmp_path / "theirs" / "disk"
    names = {}
    try:
        for who, workdir in (("mine", mine), ("theirs", theirs)):
            names[who] = f"sortie-test-{who}-{os.getpid()}"
            subprocess.run(["podman", "create", "--name", names[who], "--label",
                            "sortie.cluster=samename", "--label", f"sortie.workdir={workdir}",
                            image, "/blob"], check=True, capture_output=True)
        subprocess.run(["bash", "-c", removal_script("samename", [str(mine)], [])], check=True)
        left = subprocess.run(["podman", "ps", "-a", "--format", "{{.Names}}"],
                              capture_output=True, text=True, check=True).stdout.split()
        assert names["mine"] not in left and names["theirs"] in left
    finally:
        # One name a call: podman 4.3's `rm -f` given a name it lacks (the removal took "mine")
        # removes none of the others and exits 0 (the image stayed, in use, on every run).
        for name in names.values():
            subprocess.run(["podman", "rm", "-f", name], capture_output=True)
        subprocess.run(["podman", "rmi", image], capture_output=True)
        left = subprocess.run(["podman", "ps", "-a", "--format", "{{.Names}}"],
                              capture_output=True, text=True).stdout.split()
        assert not set(names.values()) & set(left), "the test's own containers stay"
