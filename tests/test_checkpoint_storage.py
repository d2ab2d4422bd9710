"""Checkpoints through object storage: s3:// against a real S3 API (moto's server) on loopback."""

from __future__ import annotations

import os
import subprocess
import sys

import boto3
import pytest
from moto.server import ThreadedMotoServer

from stacks.local import free_port
from tests.conftest import REPO

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
               "AWS_DEFAULT_REGION": "us-east-1"}


@pytest.fixture
def s3_endpoint(monkeypatch: pytest.MonkeyPatch):
    port = free_port("127.0.0.1")
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    for name, value in {**CREDENTIALS, "AWS_ENDPOINT_URL": endpoint}.items():
        monkeypatch.setenv(name, value)
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="sortie-test")
    yield endpoint
    server.stop()


def test_checkpoints_round_trip_through_s3(s3_endpoint: str, tmp_path):
    def train(steps: int) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
             "-m", "trainer", "--steps", str(steps), "--ckpt-every", "4", "--log-every", "4",
             "--out", str(tmp_path / "out")],
            cwd=REPO, capture_output=True, text=True, timeout=300,
            env={**os.environ, "SORTIE_CHECKPOINT_URL": "s3://sortie-test/run-1"})

    first = train(8)
    assert first.returncode == 0, first.stderr[-3000:]
    keys = {o["Key"] for o in boto3.client("s3", endpoint_url=s3_endpoint)
            .list_objects_v2(Bucket="sortie-test", Prefix="run-1/")["Contents"]}
    assert {"run-1/step-00000008/state.pt", "run-1/step-00000008/done-rank00001",
            "run-1/step-00000004/meta.json"} <= keys
    assert not (tmp_path / "out" / "checkpoints").exists(), "written locally instead of to S3"

    second = train(12)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resumed from step 8" in second.stdout
