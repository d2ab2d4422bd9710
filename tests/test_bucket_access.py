"""The controller reads a cluster's bucket as the program's deployer (issue 64: adlfs ignored
Pulumi's ARM_CLIENT_* settings, and a new Azure account gives its creator no data access until
a role assignment applies, which takes minutes)."""

from __future__ import annotations

import json
from pathlib import Path

import fsspec
import pytest
from fsspec.implementations.local import LocalFileSystem

from sortie.bootstrap import collect
from sortie.infra.cloud_home import bucket_access

pytestmark = pytest.mark.unit


def test_azure_blobs_are_read_with_the_credential_pulumi_uses(monkeypatch: pytest.MonkeyPatch):
    from azure.identity import ClientSecretCredential

    for name in ("ARM_CLIENT_ID", "ARM_CLIENT_SECRET", "ARM_TENANT_ID", "ARM_USE_MSI"):
        monkeypatch.delenv(name, raising=False)
    url = "az://sortie@acct.blob.core.windows.net/c/checkpoints"
    options, grant_s = bucket_access(url)
    assert options == {} and grant_s == 600  # adlfs's own chain (`az login`), as Pulumi's
    monkeypatch.setenv("ARM_CLIENT_ID", "11111111-1111-1111-1111-111111111111")
    monkeypatch.setenv("ARM_CLIENT_SECRET", "not-a-secret")
    monkeypatch.setenv("ARM_TENANT_ID", "22222222-2222-2222-2222-222222222222")
    options, _ = bucket_access(url)
    credential = options["credential"]
    assert isinstance(credential, ClientSecretCredential)
    assert credential._client_id == "11111111-1111-1111-1111-111111111111"
    assert bucket_access("s3://bucket/c/checkpoints") == ({}, 0.0)
    assert bucket_access("/srv/shared/checkpoints") == ({}, 0.0)


class RefusingFileSystem(LocalFileSystem):
    """A local bucket that refuses its first reads with 403, as Azure Storage does until a
    reader's role assignment applies."""

    protocol = "refusing"
    refusals = 0

    def exists(self, path: str, **kwargs: object) -> bool:
        if RefusingFileSystem.refusals:
            RefusingFileSystem.refusals -= 1
            raise PermissionError("403 AuthorizationPermissionMismatch")
        return super().exists(path, **kwargs)

    @classmethod
    def _strip_protocol(cls, path: str) -> str:
        return super()._strip_protocol(path.removeprefix("refusing://"))


def test_a_bucket_refusing_the_first_reads_is_read_once_the_role_applies(tmp_path: Path):
    fsspec.register_implementation("refusing", RefusingFileSystem, clobber=True)
    step = tmp_path / "bucket" / "step-00000010"
    step.mkdir(parents=True)
    (step / "meta.json").write_text(json.dumps({"step": 10, "world_size": 1}))
    (step / "done-rank00000").write_text("")
    url = f"refusing://{tmp_path / 'bucket'}"
    RefusingFileSystem.refusals = 2
    found = collect.collect_checkpoint(url, tmp_path / "r1", grant_s=5, first_wait_s=0.01)
    assert {a.path for a in found.artifacts} == {"checkpoints/step-00000010/meta.json",
                                                 "checkpoints/step-00000010/done-rank00000"}
    RefusingFileSystem.refusals = 1000  # a reader never granted: refused once its wait is over
    with pytest.raises(PermissionError):
        collect.collect_checkpoint(url, tmp_path / "r2", grant_s=0.05, first_wait_s=0.01)
    RefusingFileSystem.refusals = 0
