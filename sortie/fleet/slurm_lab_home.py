"""`sortie slurm-lab up|down` (root): the Slurm the project tests against (`stacks/slurm/
slurm_lab.py`: Debian's munged, slurmctld, slurmdbd and a slurmd per node, in namespaces of
their own) brought up for a user to try the Slurm backend without a cluster, and attached as
NAME through an SSH login node on loopback (its host key pinned), as a site's would be. One lab
per `$SORTIE_HOME`, kept in ``slurm-lab/`` there until `down` stops it."""

from __future__ import annotations

import contextlib
import getpass
import shutil
import sys
from pathlib import Path

from pydantic import BaseModel, Field

from sortie.core import naming, statefile
from sortie.core.errors import SortieError, UsageError
from sortie.core.inventory import LoginHost
from sortie.fleet import registry
from sortie.stacks.slurm.slurm_lab import SlurmLab, missing_tools
from sortie.stacks.slurm.slurm_sites import SlurmSites

LAB_DIR, LAB_FILE = "slurm-lab", "lab.json"
FAILED_LOGS = "slurm-lab-failed-logs"  # in $SORTIE_HOME: the daemons' logs of a start that failed
MAX_LAB_NODES = 8


class LabRecord(BaseModel):
    """What `slurm-lab up` made: the name it is attached as, and where its sorties work."""

    name: str
    nodes: int = Field(ge=1, le=MAX_LAB_NODES)
    shared_dir: str
    login: str  # USER@ADDRESS:PORT


def lab_state(home: Path) -> Path:
    return home / LAB_DIR


def lab_up(home: Path, name: str, nodes: int, python: str | None = None) -> LabRecord:
    """Start the lab (all or nothing) and attach it as ``name``; refused in one line, before
    anything starts, without root and Debian's Slurm packages, or with a lab up already."""
    state = lab_state(home)
    if (state / LAB_FILE).is_file() or state.exists():
        raise UsageError(f"slurm-lab: a lab is up already ({state}): `sortie slurm-lab down` "
                         "first")
    if not 1 <= nodes <= MAX_LAB_NODES:
        raise UsageError(f"--nodes: 1 to {MAX_LAB_NODES} compute nodes on this machine")
    missing = missing_tools()
    if missing:
        raise UsageError(f"slurm-lab: needs {', '.join(missing)} (as root: apt-get install "
                         "slurm-wlm slurmdbd mariadb-server munge iproute2 util-linux)")
    registry.refuse_taken(home, name, "--name")
    state.mkdir(parents=True, mode=0o700)
    lab = SlurmLab(state, nodes=nodes)
    try:
        lab.start()
        ssh = lab.open_login_ssh(getpass.getuser())
        shared = state / "shared"  # the nodes share this machine's disk, as a site's NFS home
        shared.mkdir(mode=0o755)
        login = LoginHost(address=ssh.address, port=ssh.port, user=getpass.getuser(),
                          key_path=ssh.client_key, host_key=ssh.host_key)
        SlurmSites(home).attach(name, str(shared), python or sys.executable, {}, login)
        record = LabRecord(name=name, nodes=nodes, shared_dir=str(shared),
                           login=f"{login.user}@{login.address}:{login.port}")
        statefile.write_json(state / LAB_FILE, record.model_dump())
        return record
    except BaseException as failed:
        lab.stop()
        logs = _keep_logs(home, state)
        shutil.rmtree(state, ignore_errors=True)
        said = str(failed)
        if type(failed) in (SortieError, UsageError) and str(state / "log") in said:
            raise type(failed)(said.replace(str(state / "log"), str(logs))) from None
        raise


def _keep_logs(home: Path, state: Path) -> Path:
    """A failed start's daemon logs, kept where the error names them (the lab's directory goes:
    before, the error named logs that went with it); a later failed start's replace them."""
    kept = home / FAILED_LOGS
    shutil.rmtree(kept, ignore_errors=True)
    with contextlib.suppress(OSError):
        shutil.move(state / "log", kept)
    return kept


def lab_down(home: Path) -> str:
    """Detach the lab's cluster (refused while a sortie allocates on it), stop every daemon,
    remove its namespaces and its directory; what was done, in one line."""
    state = lab_state(home)
    if not state.exists():
        raise UsageError("slurm-lab: no lab is up here (`sortie slurm-lab up` starts one)")
    record = statefile.read_model(LabRecord, state / LAB_FILE) \
        if (state / LAB_FILE).is_file() else None
    if record is not None and record.name in SlurmSites(home).names():
        naming.check_name(record.name, "lab.json name")
        detached = registry.teardown(home, registry.find(home, record.name))
        # (refused while an allocation uses it: its leftovers name them)
        used = [left.resource for left in detached.leftovers if left.kind == "allocation"]
        if used:
            raise UsageError(f"slurm-lab: {', '.join(used)} allocate{'s' * (len(used) == 1)} "
                             f"on {record.name}: `sortie down {used[0]}` first; nothing was "
                             "stopped")
        if not detached.clean:
            raise UsageError(f"slurm-lab: {detached.summary()}")
    SlurmLab(state).stop()
    shutil.rmtree(state, ignore_errors=True)
    return (f"Slurm lab stopped{f' and {record.name} detached' if record else ''}; "
            f"{state} removed")
