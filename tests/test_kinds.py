"""Issue 65: one entry per kind of sortie (`stacks/kinds.py`), read by the registry, which loads
a kind's module only when it acts on one of its sorties."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sortie.stacks.kinds import KINDS, LIVE_KINDS, kind_named
from tests.helpers import REPO

# What `exec` on a local cluster must not load: the other backends, a cloud SDK, torch, Pulumi.
# (slurm_sites: Slurm's site models, 0.1 s of pydantic: they load with --slurm only)
OTHERS = ("sortie.stacks.cloud.pulumi_backend", "sortie.stacks.slurm.slurm_backend",
          "sortie.stacks.slurm.slurm_sites", "sortie.stacks.attached.attached_backend",
          "sortie.stacks.cloud.cloud_records", "sortie.stacks.kept", "pulumi", "pulumi_aws",
          "pulumi_gcp", "pulumi_azure_native", "boto3", "torch",
          # The clouds' stack code, spec and catalog (a listing's access type lives apart:
          # `stacks/cloud/access.py`), and the rehearsal's modules.
          "sortie.stacks.cloud.stack_api", "sortie.infra.spec", "sortie.infra.catalog",
          "sortie.stacks.booted.cloud_rehearsal")


@pytest.mark.unit
def test_each_kind_names_its_sorties_from_its_folder_as_its_listing_does(tmp_path: Path):
    """The registry finds a NAME's kind from the folders alone (no module loaded); that must be
    what the kind's own listing says."""
    for kind in KINDS:
        for name in ("a1", "b2"):
            (tmp_path / kind.folder / name).mkdir(parents=True)
        (tmp_path / kind.folder / "Not_A_Name").mkdir()
        if kind.marker:  # a cloud sortie counts once its record is written
            (tmp_path / kind.folder / "a1" / kind.marker).write_text("{}")
    for kind in KINDS:
        listing = kind.load(tmp_path)
        assert listing.kind == kind.name
        assert kind.names(tmp_path) == listing.cluster_ids(), kind.name
        assert listing.state_dir("a1") == tmp_path / kind.folder / "a1"
    assert LIVE_KINDS == ("local", "cloud", "attached", "slurm")
    assert kind_named("elsewhere").name == "cloud"


# What stays at the top of stacks/: what every backend shares (the rest is a backend's folder).
SHARED = {"__init__", "backend", "kinds", "listing", "records", "kept", "hosts"}


@pytest.mark.unit
def test_each_backend_is_a_folder_of_its_own_that_names_its_parts():
    """Issue 65: a backend is its folder under stacks/ (as a cloud is under infra/), its class
    in it; the folder's docstring names each of its modules, so a reader finds each part from
    it; nothing else lives at the top but what every backend shares."""
    stacks = REPO / "stacks"
    assert {p.stem for p in stacks.glob("*.py")} == SHARED
    for kind in (k for k in KINDS if k.live):
        folder = stacks / kind.module.split(".")[0]
        assert "." in kind.module and (folder / f"{kind.module.split('.')[1]}.py").is_file(), \
            kind.name
    for folder in (p for p in stacks.iterdir() if (p / "__init__.py").is_file()):
        said = ast.get_docstring(ast.parse((folder / "__init__.py").read_text())) or ""
        missing = [p.name for p in folder.glob("*.py")
                   if p.name != "__init__.py" and f"`{p.name}`" not in said]
        assert not missing, f"{folder.name}/__init__.py does not name {missing}"



@pytest.mark.unit
def test_each_kinds_class_is_held_to_its_protocol_in_its_own_module():
    """Issue 65 (6): mypy checks each kind's class against its listing's protocol; the check
    lived in a list in kinds.py (a second place to edit for a new backend). Now each module
    says it of its own class (`_conforms`, for mypy only), which a new kind's must too."""
    for kind in KINDS:
        path = REPO / "stacks" / (kind.module.replace(".", "/") + ".py")
        tree = ast.parse(path.read_text())
        found = [node for node in ast.walk(tree) if isinstance(node, ast.AnnAssign)
                 and ast.unparse(node.target) == "_conforms"]
        assert found, f"{path.name}: no `_conforms` (the class held to its protocol)"
        protocol = "LiveListing" if kind.live else "Listing"
        assert ast.unparse(found[0].annotation) == f"type[{protocol}]", path.name
        assert found[0].value is not None and ast.unparse(found[0].value) == kind.listing

# Where each backend's folder is imported from outside it (docs/layout.md's change guide counts
# these): a new place fails the test below until the guide says it. The cloud's access type
# (`CloudAccess`) and Slurm's request flags are what reach furthest.
PLACES = {
    "local": {"sortie/engine/launch.py", "sortie/fleet/launch_target.py",
              "sortie/fleet/rehearse.py"},
    "booted": {"sortie/cli/stack_commands.py", "sortie/fleet/launch_target.py",
               "sortie/fleet/rehearse.py", "stacks/local/local_backend.py",
               "stacks/local/local_status.py"},
    "cloud": {"sortie/cli/fleet_commands.py", "sortie/cli/plan_view.py",
              "sortie/cli/stack_commands.py", "sortie/engine/launch_plan.py",
              "sortie/engine/reap.py", "sortie/fleet/attach_cluster.py",
              "sortie/fleet/gpu_sites.py", "sortie/fleet/launch_target.py",
              "sortie/fleet/registry.py", "sortie/fleet/status.py",
              "stacks/booted/cloud_rehearsal.py", "stacks/kinds.py"},
    "attached": {"sortie/fleet/attach_cluster.py", "sortie/fleet/registry.py"},
    "slurm": {"sortie/cli/fleet_commands.py", "sortie/cli/options.py",
              "sortie/cli/slurm_options.py", "sortie/fleet/launch_ask.py",
              "sortie/fleet/launch_target.py",
              "sortie/fleet/slurm_lab_home.py"},
}


def _importers() -> dict[str, set[str]]:
    """For each backend folder, the product's modules outside it that import from it (at any
    depth of the module; the links in sortie/ are not followed: they are the folders)."""
    found: dict[str, set[str]] = {folder: set() for folder in PLACES}
    for package in ("sortie", "stacks", "bootstrap", "infra", "trainer"):
        for root, _, files in os.walk(REPO / package):
            for path in (Path(root) / name for name in files if name.endswith(".py")):
                relative = str(path.relative_to(REPO))
                for node in ast.walk(ast.parse(path.read_text())):
                    names = [node.module or ""] if isinstance(node, ast.ImportFrom) else \
                        [a.name for a in node.names] if isinstance(node, ast.Import) else []
                    for name in names:
                        folder = name.split(".")[2] if name.startswith("sortie.stacks.") else ""
                        if folder in found and not relative.startswith(f"stacks/{folder}/"):
                            found[folder].add(relative)
    return found


@pytest.mark.unit
def test_the_places_outside_a_backend_that_know_it_are_the_ones_counted():
    """Issue 65: the change guide's count of places for a backend is tried here, not hoped."""
    assert _importers() == PLACES


@pytest.mark.e2e
def test_a_local_clusters_command_loads_no_other_backend(tmp_path: Path):
    """`exec`'s module and the lookup of a local cluster load no other backend's modules, no
    cloud SDK, no torch and no Pulumi (before: every command loaded every backend)."""
    (tmp_path / "clusters" / "held").mkdir(parents=True)
    code = ("import sys; from pathlib import Path; import sortie.cli.run_commands; "
            "from sortie.fleet import registry; "
            f"registry.find(Path({str(tmp_path)!r}), 'held'); "
            f"print(sorted(m for m in {OTHERS!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


@pytest.mark.e2e
def test_status_of_local_clusters_loads_no_ssh_gate_or_other_backend(tmp_path: Path):
    """Issue 65 (7): `status` shows what is recorded; it ran no check and reached no node, yet
    loaded the gate, paramiko and Fabric (0.43 s a call): a flag's choices and a report's type
    lived beside the gate, and every kind's backend was loaded, sorties of it or not. The
    gate's levels are `bootstrap/choices.py`'s, its report `health_report.py`'s, a node's error
    `node_calls.py`'s; a kind's module loads where its folder names a sortie."""
    heavy = ("sortie.bootstrap.health", "sortie.fleet.attach_cluster", "sortie.bootstrap.ssh",
             "paramiko", "fabric", "sortie.stacks.attached.attached_backend",
             "sortie.stacks.slurm.slurm_backend", "sortie.stacks.cloud.cloud_records")
    code = ("import sys; from sortie.cli.app import main\ntry: main(['status'])\n"
            f"except SystemExit: pass\nprint(sorted(m for m in {heavy!r} if m in sys.modules))")
    (tmp_path / "local" / "clusters" / "dev").mkdir(parents=True)  # a local cluster's folder
    for home in (tmp_path / "empty", tmp_path / "local"):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=120, check=True, env={**os.environ, "SORTIE_HOME": str(home)})
        assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout + out.stderr
