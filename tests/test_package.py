"""The tool as `pip install` gives it: the profiles and the cluster program ship in the package,
`sortie profiles` lists them (and a user's own), `sortie init` makes a Pulumi project outside the
checkout, `sortie --version` says which. The last test builds the wheel and uses it from a fresh
virtualenv in another directory."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

from sortie.stacks.profiles import load_profile, profile_path
from tests.helpers import REPO, install_wheel_alone, needs_sshd, site_of, sortie


@pytest.mark.unit
def test_profiles_lists_the_shipped_ones_and_a_users_own(tmp_path: Path, capsys,
                                                          monkeypatch: pytest.MonkeyPatch):
    from sortie.cli.app import app

    monkeypatch.setenv("SORTIE_PROFILES", "")  # --profiles sets it: restored after the test
    mine = tmp_path / "profiles"
    mine.mkdir()
    shipped = (REPO / "stacks/profiles/Pulumi.aws-p4d.yaml").read_text()
    (mine / "Pulumi.team-p4d.yaml").write_text(shipped.replace("sortie:nodes: 2",
                                                               "sortie:nodes: 4"))
    (mine / "Pulumi.broken.yaml").write_text("config: [1\n")
    with pytest.raises(SystemExit) as done:
        app.main(["--profiles", str(mine), "profiles", "--json"], prog_name="sortie")
    assert done.value.code == 0
    rows = {row["name"]: row for row in json.loads(capsys.readouterr().out)["profiles"]}
    assert {"aws-p3-dev", "aws-p4d", "gcp-a2", "azure-nd96", "team-p4d", "broken"} <= set(rows)
    assert (rows["team-p4d"]["nodes"], rows["team-p4d"]["cloud"]) == (4, "aws")
    assert rows["team-p4d"]["usd_per_hour"] == pytest.approx(
        2 * rows["aws-p4d"]["usd_per_hour"], abs=0.02)
    assert rows["broken"]["error"] and rows["broken"]["cloud"] is None, "said, not a crash"
    assert rows["aws-p4d"]["usd_per_hour"] == pytest.approx(43.92)
    assert load_profile("team-p4d")["sortie:nodes"] == 4, "--profiles reaches every command"


@pytest.mark.e2e
def test_init_writes_a_pulumi_project_that_runs_the_installed_program(tmp_path: Path):
    from sortie.stacks.cloud.project import write_project

    project = tmp_path / "my-cluster"
    written = write_project(project, "gcp-a2", ("nodes=3",))
    assert sorted(p.name for p in written) == ["Pulumi.gcp-a2.yaml", "Pulumi.yaml", "README.md",
                                               "__main__.py"]
    settings = yaml.safe_load((project / "Pulumi.yaml").read_text())
    assert settings["runtime"]["name"] == "python" and "main" not in settings
    if sys.prefix != sys.base_prefix:  # the environment sortie is installed in
        assert settings["runtime"]["options"]["virtualenv"] == sys.prefix
    config = yaml.safe_load((project / "Pulumi.gcp-a2.yaml").read_text())["config"]
    expires = config.pop("sortie:expiresAt")  # pinned: each `pulumi up` keeps it (issue 64)
    assert config == {**load_profile("gcp-a2"), "sortie:nodes": 3}
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:00Z", expires)
    entry = (project / "__main__.py").read_text()
    compile(entry, "__main__.py", "exec")
    # What the entry point runs exists, from the project's directory, as Pulumi would run it.
    found = subprocess.run([sys.executable, "-c",
                            "import sortie.infra.program as p; print(p.main)"],
                           cwd=project, capture_output=True, text=True, timeout=60,
                           env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert found.returncode == 0 and "function main" in found.stdout, found.stderr
    assert "from sortie.infra.program import main" in entry
    assert "pulumi stack init gcp-a2" in (project / "README.md").read_text()
    before = {p.name: p.read_text() for p in project.iterdir()}
    again = sortie("init", str(project), "--stack", "gcp-a2", cwd=tmp_path)
    assert again.returncode == 2 and "already has Pulumi.yaml" in again.stderr
    assert {p.name: p.read_text() for p in project.iterdir()} == before, "nothing replaced"

    # Issue 47: without --set the profile is copied as it is (its "replace it with yours"
    # comments kept), and `sortie plan --stack NAME` from inside the project plans its copy.
    plain = tmp_path / "plain"
    write_project(plain, "aws-p4d")
    copied = (plain / "Pulumi.aws-p4d.yaml").read_text()
    assert copied.startswith(profile_path("aws-p4d").read_text())
    assert copied.count("\n") == profile_path("aws-p4d").read_text().count("\n") + 1
    assert "sortie:expiresAt" in copied.splitlines()[-1] and "set it anew" in copied
    edited = (plain / "Pulumi.aws-p4d.yaml").read_text().replace(
        "198.51.100.7/32", "203.0.113.9/32")
    (plain / "Pulumi.aws-p4d.yaml").write_text(edited)
    planned = sortie("plan", "--stack", "aws-p4d", "--json", cwd=plain)
    assert planned.returncode == 0, planned.stderr
    assert "203.0.113.9/32" in planned.stdout and "198.51.100.7/32" not in planned.stdout


@pytest.mark.unit
def test_version(capsys):
    from importlib.metadata import version

    from sortie.cli.app import app

    with pytest.raises(SystemExit) as done:
        app.main(["--version"], prog_name="sortie")
    assert done.value.code == 0
    assert capsys.readouterr().out == f"sortie, version {version('sortie')}\n"


@pytest.mark.timeout(900)
@pytest.mark.e2e
@needs_sshd
def test_the_wheel_alone_runs_a_sortie_plans_and_inits_from_anywhere(tmp_path: Path):
    """Before: the wheel had no stack profiles (`plan --stack aws-p4d`: "profiles: none") and
    `pulumi up` had no project outside the checkout. The wheel goes into a fresh virtualenv
    (its dependencies from this one's site-packages, never the checkout), used from another
    directory: a user's project whose own `infra`, `stacks`, `bootstrap` and `trainer` packages
    are on the path (issue 48: the wheel installed those four names and took theirs)."""
    fresh, wheel = install_wheel_alone(tmp_path)
    python, site = fresh / "bin" / "python", site_of(fresh)
    elsewhere = tmp_path / "elsewhere"
    for name in ("infra", "stacks", "bootstrap", "trainer"):  # the user's own packages
        (elsewhere / name).mkdir(parents=True)
        (elsewhere / name / "__init__.py").write_text(f"OWNER = 'user'  # {name}\n")
    (elsewhere / "infra" / "program.py").write_text("raise SystemExit('the user program ran')\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env |= {"SORTIE_HOME": str(tmp_path / "home"), "HOME": str(tmp_path),
            "PYTHONPATH": str(elsewhere)}

    def run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run([str(fresh / "bin" / "sortie"), *args], cwd=elsewhere, env=env,
                              capture_output=True, text=True, timeout=timeout)

    where = subprocess.run([python, "-c", "import sortie, sortie.infra, sortie.stacks.profiles "
                            "as p, infra, trainer; print(sortie.__file__, sortie.infra.__file__, "
                            "p.PROFILES_DIR, infra.OWNER, trainer.OWNER)"],
                           cwd=elsewhere, env=env, capture_output=True, text=True, check=True)
    assert str(REPO) not in where.stdout and where.stdout.count(site) == 3, where.stdout
    assert where.stdout.split()[-2:] == ["user", "user"], "the user's own packages stay theirs"
    with zipfile.ZipFile(wheel) as built:
        tops = {name.split("/")[0] for name in built.namelist()}
    assert tops == {"sortie", wheel.name.split("-py")[0] + ".dist-info"}, tops
    assert run("--version").stdout.startswith("sortie, version ")
    # Without torch (the wheel no longer requires it: `sortie[local]` does): a cloud sortie
    # plans, and local nodes, which would run jobs with this Python, are refused in one line.
    unimportable = tmp_path / "no-torch"
    unimportable.mkdir()
    (unimportable / "sitecustomize.py").write_text(
        "import sys\nsys.modules['torch'] = None  # as if torch were not installed\n")
    no_torch = {**env, "PYTHONPATH": f"{unimportable}:{elsewhere}"}
    planned = subprocess.run([str(fresh / "bin" / "sortie"), "plan", "--stack", "aws-p4d",
                              "--json"], cwd=elsewhere, env=no_torch, capture_output=True,
                             text=True, timeout=300)
    assert planned.returncode == 0, planned.stderr
    assert json.loads(planned.stdout)["instance_type"] == "p4d.24xlarge"
    refused = subprocess.run([str(fresh / "bin" / "sortie"), "run", "--nodes", "2"],
                             cwd=elsewhere, env=no_torch, capture_output=True, text=True,
                             timeout=300)
    assert refused.returncode == 2 and refused.stderr.strip().splitlines() == [
        f"sortie: error: local nodes run jobs with this Python ({python}), which has no "
        "torch: pip install 'sortie[local]'"], refused.stderr
    with zipfile.ZipFile(wheel) as built:
        (metadata,) = [n for n in built.namelist() if n.endswith(".dist-info/METADATA")]
        needs = [line for line in built.read(metadata).decode().splitlines()
                 if line.startswith("Requires-Dist: torch")]
    assert needs and all("extra == " in line for line in needs), needs
    # Issue 63: no cloud's SDK either (each is an extra): the catalog plans, a cloud profile
    # is refused in one line naming the extra, before anything starts.
    (unimportable / "sitecustomize.py").write_text(
        "import sys\nfor name in ('torch', 'pulumi_aws', 'pulumi_gcp', 'pulumi_azure_native', "
        "'boto3', 's3fs', 'gcsfs', 'adlfs', 'google.auth', 'azure'):\n"
        "    sys.modules[name] = None\n")
    catalog = subprocess.run([str(fresh / "bin" / "sortie"), "plan", "--gpu", "A100:8",
                              "--json"], cwd=elsewhere, env=no_torch, capture_output=True,
                             text=True, timeout=300)
    assert catalog.returncode == 0, catalog.stderr
    no_sdk = subprocess.run([str(fresh / "bin" / "sortie"), "plan", "--stack", "gcp-a2"],
                            cwd=elsewhere, env=no_torch, capture_output=True, text=True,
                            timeout=300)
    assert no_sdk.returncode == 2 and no_sdk.stderr.strip().splitlines() == [
        "sortie: error: the gcp cloud needs its SDK (pulumi_gcp, gcsfs, google.auth not "
        "installed): pip install 'sortie[gcp]'"], no_sdk.stderr
    with zipfile.ZipFile(wheel) as built:
        requires = [line for line in built.read(metadata).decode().splitlines()
                    if line.startswith("Requires-Dist: ")]
    for sdk in ("pulumi-aws", "pulumi-gcp", "pulumi-azure-native", "boto3", "gcsfs", "adlfs"):
        lines = [line for line in requires if line.split()[1].startswith(sdk)]
        assert lines and all("extra == " in line for line in lines), (sdk, requires)
    made = run("init", str(elsewhere / "cluster"), "--stack", "aws-p4d")
    assert made.returncode == 0, made.stderr
    program = subprocess.run([python, "-c", "import sortie.infra.program as p; print(p.main)"],
                             cwd=elsewhere / "cluster", env=env, capture_output=True, text=True)
    assert "function main" in program.stdout, program.stderr
    trained = run("run", "--nodes", "2", "-p", "1", "--steps", "4", "--ckpt-every", "2",
                  "--name", "from-wheel", "--json")
    assert trained.returncode == 0, trained.stderr[-3000:]
    result = json.loads(trained.stdout)
    assert result["ok"] and result["teardown_clean"] and result["summary"]["steps"] == 4
    assert (elsewhere / "runs" / "from-wheel" / "report.html").is_file()
