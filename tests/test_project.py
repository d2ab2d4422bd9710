"""The Pulumi project file and the stub program."""

from __future__ import annotations

import json
import os
import typing
from pathlib import Path

import pytest
import tomllib
import yaml

from tests.helpers import REPO

pytestmark = pytest.mark.unit
CLOUD_ENV = ("AWS_", "GOOGLE_", "CLOUDSDK_", "AZURE_", "ARM_", "PULUMI_")


def test_pulumi_yaml_declares_the_project_and_shared_settings():
    project = yaml.safe_load((REPO / "Pulumi.yaml").read_text())
    assert project["name"] == "sortie"
    assert project["runtime"] == {"name": "python",
                                  "options": {"toolchain": "pip", "virtualenv": ".venv"}}
    assert project["main"] == "infra/"
    settings = project["config"]
    for key in ("cloud", "nodes", "instanceType", "spot", "region", "sshAllowedCidrs", "ttlHours"):
        assert key in settings and settings[key].get("description"), key
    assert settings["sshAllowedCidrs"]["type"] == "array"
    assert "default" not in settings["sshAllowedCidrs"], "SSH CIDRs must be chosen, not defaulted"


def test_stack_config_dir_is_where_sortie_reads_profiles():
    """`pulumi up` and `sortie run --stack` read the same profiles."""
    from sortie.stacks.profiles import PROFILES_DIR, load_profile, profile_names

    project = yaml.safe_load((REPO / "Pulumi.yaml").read_text())
    assert (REPO / project["stackConfigDir"]).resolve() == PROFILES_DIR
    names = profile_names()
    assert {"aws-p4d", "gcp-a2", "azure-nd96"} <= set(names)
    assert all(load_profile(name)["sortie:cloud"] in name for name in names)


def test_pyproject_dependencies_and_console_script():
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    names = {dep.split(">")[0].split("<")[0].split("=")[0].strip() for dep in
             pyproject["dependencies"]}
    assert {"pulumi", "fabric", "paramiko"} <= names
    # Each cloud's SDK is its extra's (`tests/test_extras.py`), never every install's.
    assert not names & {"pulumi-aws", "pulumi-gcp", "pulumi-azure-native"}
    # torch is the `local` extra's (local nodes and the bundled trainer), never the controller's.
    assert "torch" not in names
    torch_spec = next(d for d in pyproject["optional-dependencies"]["local"]
                      if d.startswith("torch"))
    from packaging.specifiers import SpecifierSet

    assert "2.13.0" in SpecifierSet(torch_spec.removeprefix("torch")), torch_spec
    module, _, function = pyproject["scripts"]["sortie"].partition(":")
    assert (module, function) == ("sortie.cli.start", "entry")
    import importlib

    assert callable(getattr(importlib.import_module(module), function))
    assert "pytest" in " ".join(pyproject["optional-dependencies"]["test"])


def test_project_config_schema_matches_the_spec():
    """Pulumi.yaml's declared keys are spec keys, and its defaults are the spec's defaults."""
    from sortie.infra.spec import ClusterSpec

    fields = {f.alias or name: f for name, f in ClusterSpec.model_fields.items()}
    settings = yaml.safe_load((REPO / "Pulumi.yaml").read_text())["config"]
    for key, declared in settings.items():
        assert key in fields, f"Pulumi.yaml declares {key}, which the spec does not know"
        # Its type is the spec's (issue 64: ttlHours was "integer", and Pulumi refuses 0.5).
        kinds = {str: "string", int: "integer", float: "number", bool: "boolean",
                 list[str]: "array"}
        annotation = fields[key].annotation
        kind = "string" if typing.get_origin(annotation) is typing.Literal else kinds[annotation]
        assert declared["type"] == kind, (key, annotation, declared["type"])
        if "default" in declared:
            assert declared["default"] == fields[key].default, key
        else:
            assert fields[key].is_required(), f"{key}: required by Pulumi.yaml, optional in spec"


def test_every_cloud_has_its_folder_facts_program_review_home_mocks_and_rehearsal():
    """A cloud is its folder (and its name in `clouds.py`): nothing about one cloud lives
    outside it but its spot notice, which the trainer reads on the node."""
    import importlib

    from sortie.infra.cloud_home import home
    from sortie.infra.cloud_mocks import mocks
    from sortie.infra.cloud_rehearsal import rehearsal
    from sortie.infra.clouds import CLOUDS, facts
    from sortie.stacks.profiles import load_profile

    for cloud in CLOUDS:
        assert home(cloud).name == cloud and callable(home(cloud).leftovers), cloud
        assert facts(cloud).name == cloud and facts(cloud).instance_types, cloud
        assert all(machine.cloud == cloud for machine in facts(cloud).instance_types)
        program = importlib.import_module(f"sortie.infra.{cloud}.program")
        assert callable(getattr(program, facts(cloud).component)), cloud
        assert callable(importlib.import_module(f"sortie.infra.{cloud}.review").security_summary)
        assert callable(mocks(cloud).new_resource) and mocks(cloud).provider, cloud
        assert rehearsal(cloud).cloud == cloud and rehearsal(cloud).notice_s > 0, cloud
        assert load_profile(facts(cloud).gpu_profile)["sortie:cloud"] == cloud, "--gpu's profile"
    offline = (REPO / "infra" / "offline.py").read_text()
    named = [cloud for cloud in CLOUDS if f'"{mocks(cloud).provider}:' in offline]
    assert not named, f"offline.py answers for {named}: their mocks.py should"


def test_every_shipped_profile_plans(tmp_path: Path, capsys: pytest.CaptureFixture,
                                     monkeypatch: pytest.MonkeyPatch):
    """Every shipped cloud profile plans, in this process: the program each CLI process would
    run, without a Python start and the SDKs' imports per profile (issue 63: 83 s that way)."""
    from sortie.cli.app import app
    from sortie.stacks.profiles import profile_names

    for key in [k for k in os.environ if k.startswith(CLOUD_ENV)]:  # (as `plan` offline)
        monkeypatch.delenv(key)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.aws, ~/.config/gcloud, ~/.azure
    names = profile_names()
    assert {"aws-p3-dev", "aws-p4d", "gcp-a2-dev", "gcp-a2", "azure-nd-dev",
            "azure-nd96"} <= set(names)
    for name in names:
        if name.startswith(("aws-", "gcp-", "azure-")):
            with pytest.raises(SystemExit) as done:
                app.main(["plan", "--stack", name, "--json"], prog_name="sortie")
            out = capsys.readouterr().out
            assert done.value.code == 0, name
            # Every resource's inputs, as `pulumi preview --json` shows them, secrets redacted
            # (before: type and name only).
            resources = json.loads(out)["resources"]
            assert all(r["inputs"] for r in resources if not r["type"].startswith("sortie:"))
            assert "PRIVATE KEY" not in out, name
            secrets = [r["inputs"] for r in resources if r["type"] in (
                "aws:secretsmanager/secretVersion:SecretVersion",
                "gcp:secretmanager/secretVersion:SecretVersion", "azure-native:keyvault:Secret")]
            assert secrets and all("[secret]" in json.dumps(s) for s in secrets), name
