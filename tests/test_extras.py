"""Issue 63: each cloud's SDK is an extra (`sortie[aws]`, `[gcp]`, `[azure]`, `[all]`); what
a cloud needs is named in its facts, and a command that needs a missing one says which extra
in one line (exit 2) before it starts. (The wheel installed without any of them:
`tests/test_package.py`.)"""

from __future__ import annotations

import sys

import pytest
import tomllib

from sortie.core.errors import UsageError
from sortie.infra.clouds import CLOUDS, facts, missing_sdk, require_sdk
from tests.helpers import REPO

pytestmark = pytest.mark.unit


def distribution(module: str) -> str:
    return module.replace(".", "-").replace("_", "-")


def test_each_clouds_sdk_is_its_own_extra_and_the_core_has_none():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    core = " ".join(project["dependencies"])
    extras = project["optional-dependencies"]
    for cloud in CLOUDS:
        named = " ".join(extras[cloud])
        for module in facts(cloud).sdk:
            assert distribution(module) in named, (cloud, module)
            assert distribution(module) not in core, (cloud, module)
    assert extras["all"] == ["sortie[aws,gcp,azure]"]


def test_a_missing_sdk_is_one_line_naming_the_extra(monkeypatch: pytest.MonkeyPatch):
    assert all(missing_sdk(cloud) is None for cloud in CLOUDS)  # `make install`: [all]
    # As if not installed, whichever of them an earlier test in this process imported.
    for module in ("pulumi_azure_native", "azure", *(m for m in facts("azure").sdk
                                                     if m.startswith("azure."))):
        monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(UsageError) as refused:
        require_sdk("azure")
    assert str(refused.value) == (
        "the azure cloud needs its SDK (pulumi_azure_native, azure.identity, "
        "azure.mgmt.resource, azure.mgmt.keyvault not installed): pip install 'sortie[azure]'")
    assert refused.value.exit_code == 2
    assert missing_sdk("aws") is None and missing_sdk("gcp") is None
