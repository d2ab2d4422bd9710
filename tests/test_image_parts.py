"""The parts of a job in an image that need no node: an image's name, a pull's failure as one
line, the container's command (secrets by name only), where a node may not run images, and
which registries a node logs in to as itself."""

from __future__ import annotations

import shlex
from pathlib import Path
from types import SimpleNamespace

import pytest

from sortie.bootstrap.container import (
    Pulled,
    _why_pull_failed,
    describe_pulls,
    job_line,
    refusal,
    setup_image,
    setup_key,
)
from sortie.bootstrap.registry_login import identity_login, retry_line
from sortie.core.image_ref import ImageRef
from sortie.core.inventory import Node

pytestmark = pytest.mark.unit

DIGEST = "sha256:" + "ab" * 32
NODE = Node(name="node-1", address="127.0.0.1", port=2222, user="me", gpus=0,
            key_path=Path("/k"), host_key="ssh-ed25519 AAAA", private_address="10.0.0.2",
            workdir="/srv/sortie-x")


@pytest.mark.parametrize(("text", "name", "tag", "digest"), [
    ("python", "python", None, None),
    ("nvcr.io/nvidia/pytorch:24.05-py3", "nvcr.io/nvidia/pytorch", "24.05-py3", None),
    ("localhost:5000/team/train@" + DIGEST, "localhost:5000/team/train", None, DIGEST),
    ("123456789012.dkr.ecr.us-east-1.amazonaws.com/train:v1",
     "123456789012.dkr.ecr.us-east-1.amazonaws.com/train", "v1", None),
])
def test_image_names_parse(text: str, name: str, tag: str | None, digest: str | None):
    ref = ImageRef.parse(text)
    assert (ref.name, ref.tag, ref.digest) == (name, tag, digest) and str(ref) == text
    assert str(ref.at(DIGEST)) == f"{name}@{DIGEST}" and ref.at(DIGEST).pinned


@pytest.mark.parametrize("text", ["", "Py Torch", "a;b", "$(id)", "-x", "a:b:c", "a@sha256:1",
                                  "x" * 600])
def test_what_is_no_image_name_is_refused(text: str):
    with pytest.raises(ValueError, match="is not an image reference"):
        ImageRef.parse(text)


@pytest.mark.parametrize(("text", "lowercase"), [("MyOrg/train:3", "myorg/train"),
                                                  ("Team/sub/train", "team/sub/train"),
                                                  ("UPPER/case", "upper/case")])
def test_a_capitalised_repository_is_refused_before_any_node_pulls_it(text: str,
                                                                     lowercase: str):
    # Before, it reached the nodes: podman refused it, after the cluster was up.
    with pytest.raises(ValueError, match=f"is lowercase \\({lowercase}\\)"):
        ImageRef.parse(text)


@pytest.mark.parametrize("text", ["Registry.Example.com/team/train", "LOCALHOST:5000/train",
                                  "localhost/train"])
def test_a_registry_host_may_be_any_case(text: str):
    assert ImageRef.parse(text).name == text


def test_docker_hub_names_are_the_same_repository_spelled_in_full():
    assert ImageRef.parse("python:3.11").same_repository("docker.io/library/python")
    assert not ImageRef.parse("python:3.11").same_repository("docker.io/library/pytorch")


@pytest.mark.parametrize(("output", "said"), [
    ("Error: initializing source docker://r/x:1: reading manifest 1 in r/x: manifest unknown",
     "no such image in its registry"),
    ("Error: ... unauthorized: authentication required", "the registry denied the pull"),
    ("Error: pinging container registry r: dial tcp 127.0.0.1:9: connect: connection refused",
     "the registry could not be reached"),
    ("permission denied while trying to connect to the Docker daemon socket at unix:///var/run/"
     "docker.sock", "the node's user may not use docker"),
    ("sortie: no container runtime (neither podman nor docker)",
     "no container runtime (neither podman nor docker)"),
    # Before: podman's own words alone, no way out said.
    ('Error: initializing source docker://r/x:1: pinging container registry r: Get "https://r'
     '/v2/": http: server gave HTTP response to HTTPS client',
     "the registry answers plain HTTP and the node's runtime asked HTTPS"),
])
def test_a_failed_pull_is_one_line_naming_the_image_and_the_node(output: str, said: str):
    line = _why_pull_failed(output, "r/x:1", "node-1")
    assert line.startswith("node-1: pulling r/x:1 failed: ") and said in line
    assert "\n" not in line


def test_the_job_gets_its_secrets_by_name_never_by_value():
    env = {"SORTIE_NODE_RANK": "1", "PYTHONPATH": "/srv/sortie-x/trainers/1"}
    line = job_line(NODE, "c1", "r1", f"r/x@{DIGEST}", env, ["HF_TOKEN"], "/srv/sortie-x/job",
                    ["python3", "train.py"], "/srv/sortie-x/nodes/node-1/runs/r1/container")
    script = shlex.split(line)[-1]  # what `bash -c` runs
    assert "-e HF_TOKEN " in script and "HF_TOKEN=" not in script
    assert "--network host --ipc host" in script and "--name sortie-job-r1-node-1-" in script
    assert "-v /srv/sortie-x:/srv/sortie-x" in script and "-w /srv/sortie-x/job" in script
    assert "--gpus all" not in script, "a node without GPUs is given none"
    gpu_line = job_line(NODE.model_copy(update={"gpus": 8}), "c1", "r1", f"r/x@{DIGEST}", env,
                        [], "/w", ["true"], "/r")
    assert "--device nvidia.com/gpu=all" in gpu_line and "--gpus all" in gpu_line


def test_a_setup_image_is_one_per_image_and_fingerprint():
    one = setup_image(setup_key(f"r/x@{DIGEST}", "f1"))
    assert one == setup_image(setup_key(f"r/x@{DIGEST}", "f1")) != \
        setup_image(setup_key(f"r/x@{DIGEST}", "f2"))
    assert ImageRef.parse(one).name == "localhost/sortie-setup"


def test_a_slurm_step_names_the_sites_ways_to_run_an_image():
    slurm = SimpleNamespace(image_runtimes=("pyxis", "apptainer"))
    why = refusal(slurm, NODE)  # type: ignore[arg-type]
    assert why and "pyxis or apptainer" in why and why.startswith("node-1:")
    assert refusal(SimpleNamespace(image_runtimes=("podman", "docker")), NODE) is None  # type: ignore[arg-type]


def test_the_pulls_in_one_line():
    pulled = Pulled(runtime="podman", image_id="a" * 64, digest=DIGEST, size_bytes=2_000_000_000,
                    seconds=8.25, fetched=True)
    cached = pulled.model_copy(update={"fetched": False, "seconds": 0.1})
    line = describe_pulls(ImageRef.parse(f"r/x@{DIGEST}"),
                          {"node-0": pulled, "node-1": cached})
    assert line == f"image r/x@{DIGEST} (2.00 GB): pulled on node-0 8.2s; already on node-1"


def test_two_controllers_runs_of_the_same_name_never_share_a_container_name():
    """A run named by the user (`--name imgrec`) on another controller's cluster of the same
    name on this machine (a second clone's tests beside these): the same container name, and
    the second job's start removed the first's running container (its ranks died of SIGTERM)."""
    from sortie.bootstrap.container import container_name

    mine = NODE.model_copy(update={"workdir": "/home/a/.sortie/clusters/c1/nodes/node-1/disk"})
    theirs = NODE.model_copy(update={"workdir": "/home/b/.sortie/clusters/c1/nodes/node-1/disk"})
    assert container_name("imgrec", mine) != container_name("imgrec", theirs)
    assert container_name("imgrec", mine) == container_name("imgrec", mine)  # (stop finds it)
    assert container_name("imgrec", mine).startswith("sortie-job-imgrec-node-1-")


@pytest.mark.parametrize(("image", "way", "user", "token"), [
    ("123456789012.dkr.ecr.us-east-1.amazonaws.com/team/train:3", "ECR", "AWS",
     "aws ecr get-login-password --region us-east-1"),
    ("123456789012.dkr.ecr-fips.us-gov-west-1.amazonaws.com/x:1", "ECR", "AWS",
     "--region us-gov-west-1"),
    ("europe-west4-docker.pkg.dev/proj/repo/train:3", "Artifact Registry", "oauth2accesstoken",
     "computeMetadata/v1/instance/service-accounts/default/token"),
    ("gcr.io/proj/train:3", "Artifact Registry", "oauth2accesstoken", "Metadata-Flavor: Google"),
    ("myteam01.azurecr.io/train:3", "ACR", "00000000-0000-0000-0000-000000000000",
     "https://myteam01.azurecr.io/oauth2/exchange"),
])
def test_a_cloud_registry_is_logged_in_to_as_the_node_its_way(image: str, way: str, user: str,
                                                              token: str):
    login = identity_login(ImageRef.parse(image))
    assert login is not None and login.way.startswith(f"as the node ({way}")
    assert login.username == user
    assert token in login.password and login.registry == image.split("/")[0]
    line = retry_line(login, image, "/w/pull-0.log")
    # The token goes to the runtime on stdin; the login lives in a directory removed after.
    assert '"$rt" $cfg login $auth' in line and "--password-stdin" in line
    assert line.count('rm -rf "$af"') == 3 and "$pw" not in line.split("login $auth")[1]


@pytest.mark.parametrize("image", ["nvcr.io/nvidia/pytorch:24.05-py3", "python:3.11",
                                   "127.0.0.1:5000/team/x:1", "ghcr.io/org/x:1",
                                   "evil.azurecr.io.example.com/x:1",
                                   "123456789012.dkr.ecr.us-east-1.amazonaws.com.evil.io/x:1"])
def test_any_other_registry_keeps_the_nodes_own_login(image: str):
    assert identity_login(ImageRef.parse(image)) is None


def test_a_denial_after_the_nodes_login_says_how_it_logged_in():
    said = _why_pull_failed("Error: unauthorized\nsortie: denied, logged in as the node "
                            "(ECR, the instance role): Error: 403", "r/x:1", "node-1")
    assert said == ("node-1: pulling r/x:1 failed: denied, logged in as the node (ECR, "
                    "the instance role): Error: 403")
