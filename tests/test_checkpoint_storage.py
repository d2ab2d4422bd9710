"""Checkpoints through object storage on loopback: s3:// against moto's S3 server, az:// against
Azurite (Azure Blob's emulator from npm, which `make test` installs into .azurite/), gs:// against
a GCS emulator (gcp-storage-emulator); and the wheel alone collecting from all three."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

from sortie.stacks.machine.loopback import free_port
from tests.helpers import REPO, install_wheel_alone, stop, wait_until

pytestmark = pytest.mark.e2e


@pytest.fixture
def s3_endpoint(aws_endpoint: str):
    boto3.client("s3", endpoint_url=aws_endpoint).create_bucket(Bucket="sortie-test")
    return aws_endpoint


def train_twice(url: str, out: Path, env: dict[str, str]) -> None:
    """8 steps with checkpoints at 4 and 8 through ``url``, then a run to 12 that resumes at 8."""
    def train(steps: int) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
             "-m", "trainer", "--steps", str(steps), "--ckpt-every", "4", "--log-every", "4",
             "--out", str(out)],
            cwd=REPO, capture_output=True, text=True, timeout=300,
            env={**os.environ, **env, "SORTIE_CHECKPOINT_URL": url})

    first = train(8)
    assert first.returncode == 0, first.stderr[-3000:]
    assert not (out / "checkpoints").exists(), "written locally instead of to the bucket"
    second = train(12)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resumed from step 8" in second.stdout


def assert_last_two_kept(keys: set[str]) -> None:
    """After the resumed run: steps 8 and 12 complete, step 4 pruned (keep_last=2)."""
    assert {"run-1/step-00000012/state.pt", "run-1/step-00000012/done-rank00001",
            "run-1/step-00000008/meta.json"} <= keys
    assert not any(key.startswith("run-1/step-00000004/") for key in keys)


def test_checkpoints_round_trip_through_s3(s3_endpoint: str, tmp_path: Path):
    train_twice("s3://sortie-test/run-1", tmp_path / "out", {})
    listing = boto3.client("s3", endpoint_url=s3_endpoint).list_objects_v2(
        Bucket="sortie-test", Prefix="run-1/")
    assert_last_two_kept({o["Key"] for o in listing["Contents"]})


AZURITE = REPO / ".azurite" / "node_modules" / ".bin" / "azurite-blob"
# Azurite's documented development account (public, only valid against the emulator).
DEV_ACCOUNT = ("devstoreaccount1", "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq"
               "/K1SZFPTOtr/KBHBeksoGMGw==")


@pytest.fixture
def azurite(tmp_path: Path) -> Iterator[str]:
    """Azurite's Blob service on loopback; its connection string."""
    if not AZURITE.exists():
        pytest.skip("Azurite not installed: `make test` installs it with npm into .azurite/ "
                    "(npm missing?)")
    port = free_port("127.0.0.1")
    server = subprocess.Popen(
        [str(AZURITE), "--blobHost", "127.0.0.1", "--blobPort", str(port), "--location",
         str(tmp_path / "azurite"), "--silent", "--skipApiVersionCheck"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port, server, "Azurite")
        account, key = DEV_ACCOUNT
        yield (f"DefaultEndpointsProtocol=http;AccountName={account};AccountKey={key};"
               f"BlobEndpoint=http://127.0.0.1:{port}/{account};")
    finally:
        stop(server)


@pytest.fixture
def gcs_endpoint() -> Iterator[str]:
    """A GCS JSON API on loopback (gcp-storage-emulator, from PyPI) with bucket `sortie-test`;
    gcsfs finds it through STORAGE_EMULATOR_HOST, as Google's own clients do."""
    port = free_port("127.0.0.1")
    server = subprocess.Popen(
        [sys.executable, "-m", "gcp_storage_emulator", "start", "--host", "127.0.0.1", "--port",
         str(port), "--in-memory", "--default-bucket", "sortie-test"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port, server, "the GCS emulator")
        yield f"http://127.0.0.1:{port}"
    finally:
        stop(server)


def wait_for_port(port: int, server: subprocess.Popen, what: str) -> None:
    def listening() -> bool:
        assert server.poll() is None, f"{what} ended: it did not start"
        with socket.socket() as probe:
            return probe.connect_ex(("127.0.0.1", port)) == 0

    wait_until(listening, 30, f"{what} did not start", pause=0.1)


def test_checkpoints_round_trip_through_azure_blob(tmp_path: Path, azurite: str):
    from azure.storage.blob import BlobServiceClient

    service = BlobServiceClient.from_connection_string(azurite)
    service.create_container("checkpoints")
    train_twice("az://checkpoints/run-1", tmp_path / "out",
                {"AZURE_STORAGE_CONNECTION_STRING": azurite})
    assert_last_two_kept(
        {b.name for b in service.get_container_client("checkpoints").list_blobs()})


# Run by the wheel's own Python, without torch (a controller that drives clouds has none): the
# controller's collection of a bucket's newest checkpoint.
COLLECT = """
import json, sys
from pathlib import Path
sys.modules["torch"] = None
from sortie.bootstrap.collect import collect_checkpoint
found = collect_checkpoint(sys.argv[1], Path(sys.argv[2]))
print(json.dumps(sorted(a.path for a in found.artifacts)))
"""


@pytest.mark.timeout(600)
def test_the_wheel_alone_collects_from_every_clouds_bucket(
        tmp_path: Path, s3_endpoint: str, gcs_endpoint: str, azurite: str,
        monkeypatch: pytest.MonkeyPatch):
    """Before: s3fs, gcsfs and adlfs were optional extras of their own (`make install` had no
    gcsfs), so every GCP run ended "collecting artifacts failed". Each is now its cloud's
    extra's, with the SDK that launches there (`sortie[gcp]`: no run on GCP without it), and
    the wheel with them collects from s3:// (moto), gs:// (a GCS emulator) and az://
    (Azurite)."""
    import fsspec
    from azure.storage.blob import BlobServiceClient

    fresh, wheel = install_wheel_alone(tmp_path)
    with zipfile.ZipFile(wheel) as built:
        (metadata,) = [n for n in built.namelist() if n.endswith(".dist-info/METADATA")]
        needs = {line.split()[1].split(">")[0]: line for line in
                 built.read(metadata).decode().splitlines() if line.startswith("Requires-Dist:")}
    for driver, cloud in (("s3fs", "aws"), ("gcsfs", "gcp"), ("adlfs", "azure")):
        assert driver in needs and f'extra == "{cloud}"' in needs[driver], needs.get(driver)
    BlobServiceClient.from_connection_string(azurite).create_container("sortie-test")
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_endpoint)  # this side writes there too
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azurite)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    state = os.urandom(100_000)
    for scheme in ("s3", "gs", "az"):
        url = f"{scheme}://sortie-test/run-w/checkpoints"
        fs, root = fsspec.core.url_to_fs(url)
        step = f"{root}/step-00000004"  # a complete checkpoint of one rank, as the trainer's
        fs.pipe({f"{step}/meta.json": b'{"world_size": 1, "step": 4}',
                 f"{step}/state.pt": state, f"{step}/done-rank00000": b""})
        dest = tmp_path / f"collected-{scheme}"
        done = subprocess.run([fresh / "bin" / "python", "-c", COLLECT, url, str(dest)],
                              cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, f"{scheme}: {done.stderr[-2000:]}"
        assert "checkpoints/step-00000004/state.pt" in json.loads(done.stdout), done.stdout
        assert (dest / "checkpoints" / "step-00000004" / "state.pt").read_bytes() == state
