"""Checkpoints through object storage on loopback: s3:// against moto's S3 server, az:// against
Azurite (Azure Blob's emulator from npm, which `make test` installs into .azurite/)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import boto3
import pytest

from sortie.stacks.loopback import free_port
from tests.helpers import REPO

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


@pytest.mark.skipif(not AZURITE.exists(), reason="Azurite not installed: `make test` installs it "
                    "with npm into .azurite/ (npm missing?)")
def test_checkpoints_round_trip_through_azure_blob(tmp_path: Path):
    from azure.storage.blob import BlobServiceClient

    port = free_port("127.0.0.1")
    azurite = subprocess.Popen(
        [str(AZURITE), "--blobHost", "127.0.0.1", "--blobPort", str(port), "--location",
         str(tmp_path / "azurite"), "--silent", "--skipApiVersionCheck"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while socket.socket().connect_ex(("127.0.0.1", port)) != 0:
            assert time.monotonic() < deadline and azurite.poll() is None, "Azurite did not start"
            time.sleep(0.1)
        account, key = DEV_ACCOUNT
        connection = (f"DefaultEndpointsProtocol=http;AccountName={account};AccountKey={key};"
                      f"BlobEndpoint=http://127.0.0.1:{port}/{account};")
        service = BlobServiceClient.from_connection_string(connection)
        service.create_container("checkpoints")
        train_twice("az://checkpoints/run-1", tmp_path / "out",
                    {"AZURE_STORAGE_CONNECTION_STRING": connection})
        assert_last_two_kept(
            {b.name for b in service.get_container_client("checkpoints").list_blobs()})
    finally:
        azurite.terminate()
        azurite.wait(10)
