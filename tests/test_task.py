"""Task files (`sortie/engine/task.py`) and what every node is told (`bootstrap/contract.py`): a bad
field is one line naming it, before anything starts; paths stay inside the workdir; secrets and
required variables come from the caller's environment."""

from __future__ import annotations

from pathlib import Path

import pytest

from sortie.bootstrap.contract import node_environment
from sortie.bootstrap.trainer_bundle import trainer_version
from sortie.core.errors import UsageError
from sortie.core.image_ref import RegistryAuth
from sortie.core.inventory import Inventory, Node
from sortie.engine.task import (
    Task,
    image_fields,
    load_task,
    resolve_environment,
    task_with_flags,
    with_flags,
)

pytestmark = pytest.mark.unit

FULL = """\
name: my-exp
nodes: 2
procs_per_node: 2
workdir: code
setup: pip install -r requirements.txt
setup_inputs: [requirements.txt]
image: nvcr.io/nvidia/pytorch:24.05-py3
script: train.py
args: [--epochs, "3"]
env: {WANDB_MODE: offline, PORT: 8080, DEBUG: true, DATA_DIR: null}
secrets: [HF_TOKEN]
artifacts: ["outputs/*.pt"]
stack: aws-p3-dev
set: [nodes=4]
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "task.yaml"
    path.write_text(text)
    return path


def test_every_field_is_read(tmp_path: Path):
    task = load_task(write(tmp_path, FULL))
    assert task.name == "my-exp" and task.nodes == 2 and task.procs_per_node == 2
    assert task.workdir == tmp_path.resolve() / "code", "relative to the task file"
    assert task.script == "train.py" and task.args == ("--epochs", "3") and task.is_user_job
    assert task.env == {"WANDB_MODE": "offline", "PORT": "8080", "DEBUG": "true",
                        "DATA_DIR": None}
    assert task.secrets == ("HF_TOKEN",) and task.artifacts == ("outputs/*.pt",)
    assert task.stack == "aws-p3-dev" and task.overrides == ("nodes=4",)
    assert task.image == "nvcr.io/nvidia/pytorch:24.05-py3"


def test_a_task_of_no_fields_is_the_bundled_trainer_an_empty_file_a_mistake(tmp_path: Path):
    task = load_task(write(tmp_path, "{}"))
    assert not task.is_user_job and task.workdir is None
    # An empty file (a save gone wrong, everything commented out) ran the bundled trainer on a
    # whole cluster: it is refused, in one line.
    for text in ("", "# script: train.py\n", "null\n"):
        with pytest.raises(UsageError, match="empty \\(no fields\\)"):
            load_task(write(tmp_path, text))


@pytest.mark.parametrize(("text", "message"), [
    ("nodes: 0", "nodes: Input should be greater than or equal to 1"),
    ("procs_per_node: many", "procs_per_node: Input should be a valid integer"),
    ("name: My_Exp", "name: 'My_Exp': use 1-63 lowercase letters"),
    ("script: train.py\nrun: torchrun x", "give `script`"),
    ("args: [--x]", "`args` go with `script`"),
    ("script: ../../etc/passwd", "must be a relative path inside the workdir"),
    ("artifacts: [/root/.ssh/id_rsa]", "must be a relative path inside the workdir"),
    ("env: {SORTIE_NODE_RANK: '3'}", "SORTIE_NODE_RANK is set by sortie"),
    ("env: {MASTER_ADDR: x}", "MASTER_ADDR is set by sortie"),
    ("env: {'BAD NAME': x}", "'BAD NAME' is not an environment variable name"),
    ("secrets: [TOKEN]\nenv: {TOKEN: x}", "a name is in both `env` and `secrets`"),
    ("scripts: train.py", "scripts: unknown field; fields: name, nodes"),
    ("- a list", "a task is a mapping of fields"),
    ("nodes: [1", "not a YAML task"),
    ("image: 'pytorch; rm -rf /'", "image: 'pytorch; rm -rf /' is not an image"),
    ("image: Pytorch:latest", "is not an image reference ([registry/]name[:tag]"),
])
def test_a_bad_field_is_one_line_naming_it(tmp_path: Path, text: str, message: str):
    path = write(tmp_path, text)
    with pytest.raises(UsageError) as error:
        load_task(path)
    line = str(error.value)
    assert "\n" not in line and line.startswith(str(path)) and message in line, line
    assert error.value.exit_code == 2


def test_a_huge_task_file_is_refused(tmp_path: Path):
    with pytest.raises(UsageError, match="over 1024 KiB"):
        load_task(write(tmp_path, "# " + "x" * (1 << 20)))


def test_flags_override_the_file_and_are_validated_with_it(tmp_path: Path):
    task = load_task(write(tmp_path, FULL))
    flagged = with_flags(task, nodes=3, procs_per_node=None, artifacts=())
    assert flagged.nodes == 3 and flagged.procs_per_node == 2
    assert flagged.artifacts == ("outputs/*.pt",) and flagged.workdir == task.workdir
    with pytest.raises(UsageError, match="give `script`"):
        with_flags(task, run="torchrun train.py")



def test_a_script_alone_syncs_the_directory_it_is_run_from(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch):
    """Before: `sortie run --script train.py` in the project refused ("give one (--workdir
    DIR)"), where `torchrun train.py` runs it. A task file names its own; `--run` syncs none."""
    monkeypatch.chdir(tmp_path)
    assert task_with_flags(None, script="train.py").workdir == tmp_path
    assert task_with_flags(None, script="t.py", workdir=tmp_path / "w").workdir == tmp_path / "w"
    assert task_with_flags(None, run="nvidia-smi").workdir is None
    task = write(tmp_path, "name: x\nnodes: 2\n")
    assert task_with_flags(task, script="train.py").workdir is None


def test_a_scripts_absolute_path_is_taken_inside_the_workdir_and_named_outside(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Tab completion's `--script ~/proj/src/train.py` was refused ("must be a relative path
    inside the workdir") where it is in the workdir; outside it, the error named neither the
    workdir nor the flags that would run it."""
    project = tmp_path / "proj"
    (project / ".git").mkdir(parents=True)
    (project / "src").mkdir()
    monkeypatch.chdir(project)
    assert task_with_flags(None, script=str(project / "src" / "train.py")).script == \
        "src/train.py"
    linked = tmp_path / "link"
    linked.symlink_to(project)  # the workdir by a link, the script by its real path
    assert task_with_flags(None, script=str(project / "train.py"), workdir=linked).script == \
        "train.py"
    elsewhere = tmp_path / "other"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    with pytest.raises(UsageError) as refused:
        task_with_flags(None, script=str(project / "src" / "train.py"))
    assert str(refused.value) == (
        f"--script: {project}/src/train.py is not in the workdir ({elsewhere}), which is what "
        "goes to the nodes: give the project's directory as --workdir and the script's path "
        f"in it (`--workdir {project} --script src/train.py`)")
    with pytest.raises(UsageError, match="--script: '/abs/t.py' must be a relative path"):
        with_flags(Task(), script="/abs/t.py")  # a task's own field: as before


def test_setup_and_env_flags_fill_a_task_without_a_file(tmp_path: Path):
    """A workdir with a requirements.txt needs no task file (`--setup`, `--env`); `--env` sets
    one variable at a time over the file's, and is recorded as the file's `env` is."""
    flagged = with_flags(Task(), script="train.py", setup="pip install -r requirements.txt",
                         env={"WANDB_MODE": "offline", "DATA_DIR": None})
    assert flagged.setup == "pip install -r requirements.txt"
    assert flagged.env == {"WANDB_MODE": "offline", "DATA_DIR": None}
    task = load_task(write(tmp_path, FULL))
    over = with_flags(task, env={"PORT": "9090", "NEW": "1"}, setup="uv pip sync uv.lock")
    assert over.env == {"WANDB_MODE": "offline", "PORT": "9090", "DEBUG": "true",
                        "DATA_DIR": None, "NEW": "1"}
    assert over.setup == "uv pip sync uv.lock" and with_flags(task, env={}).env == task.env
    for env, said in (({"1BAD": "x"}, r"^--env: '1BAD' is not an environment variable name"),
                      ({"SORTIE_RANK": "3"}, r"^--env: SORTIE_RANK is set by sortie"),
                      ({"HF_TOKEN": "x"}, "a name is in both `env` and `secrets`")):
        with pytest.raises(UsageError, match=said):
            with_flags(task, env=env)
    with pytest.raises(UsageError, match=r"^--setup: empty"):
        with_flags(task, setup=" ")
    with pytest.raises(UsageError, match=r"^env\.DATA_DIR: required \(null in the task, or "
                                         r"`--env DATA_DIR` without a value\)"):
        resolve_environment(flagged, {})

def test_environment_and_secrets_come_from_the_caller():
    task = Task(env={"MODE": "x", "DATA_DIR": None}, secrets=("HF_TOKEN",))
    env, secrets = resolve_environment(task, {"DATA_DIR": "/data", "HF_TOKEN": "hf_s3cret"})
    # A null value (often a secret by mistake) is passed like a secret: never recorded in
    # job.json or the shared record, never on a node's command line.
    assert env == {"MODE": "x"} and secrets == {"HF_TOKEN": "hf_s3cret", "DATA_DIR": "/data"}
    with pytest.raises(UsageError, match=r"^env\.DATA_DIR: required"):
        resolve_environment(task, {"HF_TOKEN": "t"})
    with pytest.raises(UsageError, match=r"^secrets: HF_TOKEN not set"):
        resolve_environment(task, {"DATA_DIR": "/data"})



def test_a_private_registrys_login_names_its_password_never_holds_it(tmp_path: Path):
    (tmp_path / "task.yaml").write_text("image: nvcr.io/team/private/train:3\nregistry_auth:\n"
                                        "  username: $oauthtoken\n  password: NGC_API_KEY\n")
    task = load_task(tmp_path / "task.yaml")
    assert task.registry_auth == RegistryAuth(username="$oauthtoken", password="NGC_API_KEY")
    fields = image_fields(task, {"NGC_API_KEY": "nvapi-s3cret"})
    assert fields["registry_password"] == "nvapi-s3cret"
    with pytest.raises(UsageError, match=r"^registry_auth\.password: NGC_API_KEY not set"):
        image_fields(task, {})
    for bad, field in (("registry_auth: {username: u, password: NGC_API_KEY}\n", "image"),
                       ("image: r.io/x:1\nregistry_auth: {username: u, password: 'hunter2!'}\n",
                        "password"),
                       ("image: r.io/x:1\nregistry_auth: {username: a b, password: P}\n",
                        "username")):
        (tmp_path / "bad.yaml").write_text(bad)
        with pytest.raises(UsageError, match=field) as refused:
            load_task(tmp_path / "bad.yaml")
        assert "hunter2" not in str(refused.value) and "\n" not in str(refused.value)

def node(index: int) -> Node:
    return Node(name=f"node-{index}", address="203.0.113.9", port=22, user="u",
                key_path=Path("/k"), host_key="ssh-ed25519 AAAA", gpus=8,
                private_address=f"10.0.0.{index + 5}", workdir="/w")


def test_every_node_is_told_its_place():
    inventory = Inventory(cluster_id="c", backend="aws", nodes=[node(0), node(1), node(2)],
                          rdzv_port=29400, train_env={"SORTIE_CHECKPOINT_URL": "s3://b/c/ck"})
    env = node_environment(inventory, inventory.nodes[2], run_id="r1", procs_per_node=8,
                           workdir="/w/job", artifact_dir="/w/runs/r1/out", python="python3")
    assert env == {
        "SORTIE_NODE_RANK": "2", "SORTIE_NUM_NODES": "3",
        "SORTIE_NODE_IPS": "10.0.0.5\n10.0.0.6\n10.0.0.7",
        "SORTIE_MASTER_ADDR": "10.0.0.5", "SORTIE_MASTER_PORT": "29400",
        "SORTIE_PROCS_PER_NODE": "8", "SORTIE_GPUS_PER_NODE": "8", "SORTIE_RUN_ID": "r1",
        "SORTIE_WORKDIR": "/w/job", "SORTIE_ARTIFACT_DIR": "/w/runs/r1/out",
        "SORTIE_CHECKPOINT_URL": "s3://b/c/ck", "SORTIE_PYTHON": "python3",
        "SORTIE_TORCHRUN": f"python3 /w/trainers/{trainer_version()}/trainer/torchrun.py",
        "MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "29400", "NODE_RANK": "2"}


def test_only_torchruns_ranks_get_one_thread_a_run_lines_command_its_own():
    """Before: a `run` line's command (`python eval.py`, a tool of its own) had
    OMP_NUM_THREADS=1 forced on it: one thread on a node of many, `nproc` said 1."""
    from sortie.bootstrap.train import job_command
    from sortie.core.job import Command, Job

    inventory = Inventory(cluster_id="c", backend="aws", nodes=[node(0), node(1)],
                          rdzv_port=29400)

    def started(command: Command) -> str:
        job = Job(run_id="r1", procs_per_node=2, command=command)
        return job_command(inventory.nodes[1], inventory, job)[1]

    assert "OMP_NUM_THREADS" not in started(Command(run="python eval.py"))
    assert "OMP_NUM_THREADS=1 " in started(Command(script="train.py"))
    assert "OMP_NUM_THREADS=8 " in started(Command(script="train.py",
                                                   env={"OMP_NUM_THREADS": "8"}))
    assert "OMP_NUM_THREADS=4 " in started(Command(run="python eval.py",
                                                   env={"OMP_NUM_THREADS": "4"}))


def test_arguments_after_the_separator_go_to_a_script_only():
    from sortie.engine.task import resolve_job

    with pytest.raises(UsageError, match=r"^-- ARGS: arguments after `--` go to a `script`"):
        resolve_job(Task(run="torchrun train.py"), passthrough=("--epochs", "3"))
    job = resolve_job(Task(run="echo hi"))
    assert job.task is not None and job.task.args == () and job.command.script_args == ()


def test_a_task_for_a_new_cluster_runs_on_a_held_one_without_what_makes_one(tmp_path: Path):
    from sortie.engine.held_cluster import for_held_cluster

    task = load_task(write(tmp_path, FULL))
    held, ignored = for_held_cluster(task, 2, "scratch")
    assert ignored == ["name", "stack", "set"]
    assert (held.name, held.stack, held.overrides) == (None, None, ())
    assert held.script == task.script and held.nodes == 2
    with pytest.raises(UsageError, match="nodes: 2: cluster scratch has 3 nodes"):
        for_held_cluster(task, 3, "scratch")
    assert for_held_cluster(Task(script="t.py"), 1, "one") == (Task(script="t.py"), [])


def test_a_cluster_without_a_shared_place_leaves_the_checkpoint_url_unset():
    """Before: a cluster attached from a hosts file told every job SORTIE_CHECKPOINT_URL=""."""
    inventory = Inventory(cluster_id="c", backend="attached", nodes=[node(0)])
    env = node_environment(inventory, inventory.nodes[0], run_id="r1", procs_per_node=1,
                           workdir="/w/job", artifact_dir="/w/runs/r1/out", python="python3")
    assert "SORTIE_CHECKPOINT_URL" not in env


def test_each_nodes_interface_is_the_one_its_check_found_unless_the_cluster_names_one() -> None:
    """Issue 67 (1), on every backend: gloo and NCCL bind, per node, on the interface that holds
    the node's address, as the node's check found it (names differ per node); a backend's own
    choice (a Slurm node's, the local nodes' `lo`) and the cluster's environment (a hosts
    file's `env`, Azure's eth0) are kept."""
    from sortie.bootstrap.checks import NodeFacts, with_interfaces
    from sortie.bootstrap.contract import cluster_environment, interfaces_kept
    from sortie.core.inventory import Inventory, Node

    def node(i: int, interface: str | None = None) -> Node:
        return Node(name=f"node-{i}", address=f"10.0.0.{i + 1}", port=22, user="u", gpus=0,
                    key_path="/k", host_key="ssh-ed25519 AAAA", workdir="/w",
                    private_address=f"10.0.0.{i + 1}", interface=interface)

    facts = {f"node-{i}": NodeFacts.parse(f"python=3.11.7 torch=2.13 gpus=0 iface={iface}")
             for i, iface in enumerate(("ens5", "eth-n2", "-"))}
    assert {name: found.interface for name, found in facts.items()} == {
        "node-0": "ens5", "node-1": "eth-n2", "node-2": None}
    inventory = Inventory(cluster_id="c", backend="attached",
                          nodes=[node(0), node(1, "ib0"), node(2)])
    found = with_interfaces(inventory, facts)
    assert [n.interface for n in found.nodes] == ["ens5", "ib0", None]
    assert cluster_environment(found, found.nodes[0]) == {
        "GLOO_SOCKET_IFNAME": "ens5", "NCCL_SOCKET_IFNAME": "ens5"}
    named = found.model_copy(update={"train_env": {"NCCL_SOCKET_IFNAME": "eth0"}})
    assert cluster_environment(named, found.nodes[0]) == {
        "NCCL_SOCKET_IFNAME": "eth0", "GLOO_SOCKET_IFNAME": "ens5"}
    # After node-2 was replaced (another address): the others keep theirs, it has none yet.
    replaced = inventory.model_copy(update={"nodes": [node(0), node(1, "ib0"), node(7)]})
    kept = interfaces_kept(replaced, found)
    assert [(n.address, n.interface) for n in kept.nodes] == [
        ("10.0.0.1", "ens5"), ("10.0.0.2", "ib0"), ("10.0.0.8", None)]
    assert NodeFacts.parse("python=3 torch=2 gpus=0 iface=$(x)").interface is None  # untrusted


def test_a_command_runs_a_script_or_a_line():
    from pydantic import ValidationError

    from sortie.core.job import Command, is_user_job
    with pytest.raises(ValidationError, match="a `script` or a `run` line"):
        Command(env={"A": "b"})
    assert Task(run="true").is_user_job and not Task().is_user_job
    assert is_user_job("train.py", None) and not is_user_job(None, "")


def test_a_recorded_workdir_is_an_absolute_path():
    """A job record is read back by another controller: the workdir it syncs from is the
    absolute path the launch resolved, never a relative or unprintable one."""
    from pydantic import ValidationError

    from sortie.core.job import Command
    assert Command(run="true", workdir="/home/u/code").workdir == "/home/u/code"
    for bad in ("code", "~/code", "/tmp/a\nb"):
        with pytest.raises(ValidationError, match="not an absolute path"):
            Command(run="true", workdir=bad)


def test_a_script_that_sets_the_rendezvous_itself_is_found(tmp_path: Path):
    """The PyTorch tutorials' single-node setup (`os.environ['MASTER_ADDR'] = 'localhost'`) in
    a multi-node run: every rank waited for a store on its own node, silent for the hang
    timeout (30 minutes). Now the lines are named before the job starts."""
    from sortie.bootstrap.workdir import SyncPlan, sets_rendezvous

    (tmp_path / "train.py").write_text(
        "import os\n\ndef setup():\n    os.environ['MASTER_ADDR'] = 'localhost'\n"
        "    os.environ[\"MASTER_PORT\"]=\"12355\"\n"
        "    # os.environ['MASTER_ADDR'] = 'commented out'\n"
        "    if os.environ['MASTER_ADDR'] == 'localhost': pass\n"
        "    os.environ.setdefault('MASTER_PORT', '1')\n")
    (tmp_path / "notes.txt").write_text("os.environ['MASTER_ADDR'] = 'x'\n")
    plan = SyncPlan(root=tmp_path, files=("notes.txt", "train.py"), bytes=0, rules="")
    assert sets_rendezvous(plan) == ["train.py:4 sets MASTER_ADDR", "train.py:5 sets MASTER_PORT"]
    # The other tutorials' ways: a tcp:// init_method (a hang of 148 s and counting, tried on
    # local nodes), os.environ.update; env:// (torchrun's) is right.
    (tmp_path / "ddp.py").write_text(
        "import os\nos.environ.update(MASTER_ADDR='127.0.0.1')\n"
        "dist.init_process_group('gloo', init_method='tcp://localhost:23456', rank=r)\n"
        "dist.init_process_group('gloo', init_method=\"env://\")\n"
        "dist.init_process_group(init_method=f\"tcp://{host}:{port}\")\n")
    plan = SyncPlan(root=tmp_path, files=("ddp.py",), bytes=0, rules="")
    assert sets_rendezvous(plan) == ["ddp.py:2 sets MASTER_ADDR",
                                     "ddp.py:3 sets init_method tcp://localhost:23456",
                                     "ddp.py:5 sets init_method tcp://{host}:{port}"]


def test_a_shell_script_given_as_script_is_told_to_go_in_run(tmp_path: Path):
    """`--script train.sh` ran `python train.sh` on every rank under torchrun: "a process
    raised SyntaxError: invalid syntax", after the cluster came up. Refused first (exit 2)."""
    from sortie.engine.job_script import not_python

    for name, text in {"train.sh": "#!/bin/bash\necho $RANK\n", "plain.sh": "echo hi\n",
                       "run": "#!/usr/bin/env bash\n", "train.py": "#!/usr/bin/env python3\n",
                       "py.sh": "#!/usr/bin/env python3\n", "noext": "print(1)\n"}.items():
        (tmp_path / name).write_text(text)
    def said(name: str) -> str:
        return not_python(tmp_path / name, name)

    assert said("train.sh").startswith("train.sh is a script for '/bin/bash', and torchrun runs")
    assert said("plain.sh").startswith("plain.sh is a shell script, and")
    assert said("run").startswith("run is a script for '/usr/bin/env bash', and")
    assert said("run").endswith("`--run 'bash run'` (once on every node, with MASTER_ADDR, "
                                "NODE_RANK and the rest set)")
    assert [said(name) for name in ("train.py", "py.sh", "noext", "gone")] == ["", "", "", ""]
    # A researcher's notebook: JSON, which Python reads as an expression (or fails on).
    assert said("train.ipynb") == ("train.ipynb is a Jupyter notebook, and torchrun runs a "
                                   "Python file: `jupyter nbconvert --to script train.ipynb` "
                                   "writes train.py from it")
    # The refusal, before anything starts: tests/test_user_job_cli.py (it lists the workdir).


def test_a_run_line_starting_a_ddp_script_with_plain_python_is_found(tmp_path: Path):
    """`--run 'python train.py'` of a DDP script failed on every rank ("environment variable
    RANK expected, but not set"), after the cluster came up: said first, by a dry run too."""
    from sortie.bootstrap.workdir import SyncPlan, started_without_torchrun

    files = {"train.py": "import torch.distributed as dist\ndist.init_process_group('gloo')\n",
             "single.py": "print('one process')\n",
             "spawns.py": "dist.init_process_group('gloo')\nmp.spawn(main, nprocs=2)\n",
             "own.py": "dist.init_process_group('gloo', init_method=url,\n"
                       "    rank=int(os.environ['SORTIE_NODE_RANK']), world_size=n)\n"}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    plan = SyncPlan(root=tmp_path, files=tuple(sorted(files)), bytes=0, rules="")
    assert started_without_torchrun(plan, "python train.py --epochs 3") == "train.py"
    assert started_without_torchrun(plan, "cd . && /env/bin/python3.11 train.py") is None, \
        "the line's first command only"
    assert started_without_torchrun(plan, "python3 train.py && echo done") == "train.py"
    for line in ("torchrun --nproc-per-node 2 train.py", "python -m torch.distributed.run "
                 "train.py", "python single.py", "python spawns.py", "python own.py",
                 "python gone.py", "bash train.py", "python 'unclosed"):
        assert started_without_torchrun(plan, line) is None, line


def test_a_subdirectorys_script_importing_the_workdirs_top_is_found(tmp_path: Path):
    """`src/train.py` importing the workdir's `mypkg/` ran at home through the shell's
    PYTHONPATH and failed on every node with ModuleNotFoundError: named before it starts (a
    dry run, a cloud's boot), as the error line names it after."""
    from sortie.bootstrap.workdir import SyncPlan, imports_out_of_reach

    files = {"mypkg/__init__.py": "", "mypkg/models.py": "", "helpers.py": "", "os.py": "",
             "src/train.py": "import os, mypkg.models as m\nfrom helpers import h\n"
                             "from . import sibling\nimport local\nimport torch\n",
             "src/local.py": "", "src/helpers.py": "", "top.py": "import mypkg\n",
             "tools/fix.py": "import sys\nsys.path.insert(0, '.')\nimport mypkg\n",
             "tools/broken.py": "import mypkg\ndef (:\n"}
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    plan = SyncPlan(root=tmp_path, files=tuple(sorted(files)), bytes=0, rules="")
    assert imports_out_of_reach(plan, "src/train.py") == [("mypkg", "mypkg/")], \
        "helpers and local are beside it, os is the standard library's, torch is not the workdir's"
    assert imports_out_of_reach(plan, "top.py") == [], "a script at the top finds the top"
    assert imports_out_of_reach(plan, "tools/fix.py") == [], "it sets its own sys.path"
    assert imports_out_of_reach(plan, "tools/broken.py") == [], "not Python: said by Python"
    assert imports_out_of_reach(plan, "src/missing.py") == []


def test_the_bundled_trainer_takes_variables_with_values_and_nothing_of_a_jobs_own():
    """An ops engineer's burn-in: `sortie run --env NCCL_DEBUG=INFO` (before: refused, "give
    `script` or `run`"). Recorded with the job (a takeover relaunches with them), reaching every
    process it starts; a value from the caller's environment (a secret's way) is refused."""
    from pydantic import ValidationError

    from sortie.bootstrap.train import job_environment
    from sortie.core.job import Job
    from sortie.engine.request import RunRequest
    from sortie.engine.task import job_for, trainer_environment

    task = with_flags(Task(), env={"NCCL_DEBUG": "INFO", "NCCL_SOCKET_IFNAME": "eth0"})
    assert job_for(task) is None
    job = RunRequest(trainer_env=trainer_environment(task)).job("r1")
    assert job.trainer_env == {"NCCL_DEBUG": "INFO", "NCCL_SOCKET_IFNAME": "eth0"}
    assert Job.model_validate_json(job.model_dump_json()) == job
    inventory = Inventory(cluster_id="c", backend="local", nodes=[node(0), node(1)])
    env = job_environment(inventory.nodes[1], inventory, job, "/w")
    assert env["NCCL_DEBUG"] == "INFO" and env["SORTIE_NODE_RANK"] == "1"
    with pytest.raises(UsageError, match=r"^env\.HF_TOKEN: the bundled trainer takes a value "):
        trainer_environment(with_flags(Task(), env={"HF_TOKEN": None}))
    with pytest.raises(UsageError, match=r"^setup: give `script` or `run`"):
        job_for(with_flags(Task(), setup="pip install x", env={"A": "1"}))
    with pytest.raises(ValidationError, match="SORTIE_NODE_RANK is set by sortie"):
        Job(run_id="r1", procs_per_node=1, trainer_env={"SORTIE_NODE_RANK": "0"})
