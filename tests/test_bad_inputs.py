"""Every bad input is refused in one line before anything starts (issue 29): the real command
line, in this process, against a table of what a careless user or an attacker hands it (flags,
task files, hosts files, outputs files, `--set`, environment variables).

Each case asserts the exit code, one line on stderr naming the field, no traceback, and that
nothing was created: the test's directory holds exactly the files the case wrote, and no
SORTIE_HOME was made. What needs real nodes is in `test_bad_inputs_on_nodes.py`."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from sortie.cli import app as cli
from sortie.core.errors import UsageError, last_line
from sortie.infra.keys import ed25519_key_pair, fingerprint

# Each test's mark is its own: `unit` starts no process, `e2e` does (issue 63).

HOST_KEY = ed25519_key_pair().public_openssh
CLIENT_KEY = ed25519_key_pair().private_openssh
DEEP = "[" * 50_000 + "]" * 50_000
# A few lines of YAML that stand for ten million values (each alias repeats the one before).
LAUGHS = "a: &a [1,1,1,1,1,1,1,1,1,1]\n" + "".join(
    f"{b}: &{b} [{', '.join(['*' + a] * 10)}]\n" for a, b in zip("abcdef", "bcdefg", strict=True))


def outputs(**changes: object) -> str:
    """A stack's outputs, as `pulumi stack output --json --show-secrets` saves them."""
    document = {
        "cluster": "exp", "cloud": "aws", "ssh_user": "ubuntu", "workdir": "/home/ubuntu",
        "python": "/usr/bin/python3", "gpus_per_node": 0, "bucket_url": "s3://b",
        "client_private_key": CLIENT_KEY,
        "nodes": [{"name": f"node-{i}", "public_address": f"127.0.1.{i + 1}",
                   "private_address": f"127.0.1.{i + 1}", "host_key": HOST_KEY,
                   "host_key_fingerprint": fingerprint(HOST_KEY), "spot": False}
                  for i in range(2)]}
    document.update(changes)
    return json.dumps(document)


def node(**changes: object) -> dict:
    return {**json.loads(outputs())["nodes"][0], **changes}


def hosts(*entries: dict, **top: object) -> str:
    """A hosts file; each host's key pinned inline unless the entry says otherwise."""
    listed = [{"host_key": HOST_KEY, **entry} for entry in entries]
    return yaml.safe_dump({"identity_file": "id", **top, "hosts": listed})


@dataclass(frozen=True)
class Case:
    args: list[str]
    field: str  # in the one line of error
    files: dict[str, str | bytes] = field(default_factory=dict)  # written in the cwd first
    env: dict[str, str] = field(default_factory=dict)
    code: int = 2


CASES = {
    # -- task files
    "task nested 50,000 deep": Case(["run", "t.yaml"], "nested more than 16 levels",
                                    {"t.yaml": f"nodes: {DEEP}"}),
    "task of a billion laughs": Case(["run", "t.yaml"], "more than 100000 values",
                                     {"t.yaml": LAUGHS}),
    "task nodes: true": Case(["run", "t.yaml"], "nodes: Input should be a valid integer",
                             {"t.yaml": "nodes: true"}),
    "task procs_per_node: true": Case(["run", "t.yaml"], "procs_per_node",
                                      {"t.yaml": "procs_per_node: true"}),
    "task nodes: 256 locally": Case(["run", "t.yaml"], "nodes: 256: a local cluster has at "
                                    "most 254", {"t.yaml": "nodes: 256"}),
    "task nodes: 600": Case(["run", "t.yaml"], "nodes: Input should be less than or equal "
                            "to 512", {"t.yaml": "nodes: 600"}),
    "task setup_inputs missing": Case(
        ["run", "t.yaml"], "setup_inputs: requirements.txt: no file of that name is synced",
        {"t.yaml": "workdir: code\nscript: train.py\nsetup: pip install -r requirements.txt\n"
                   "setup_inputs: [requirements.txt]", "code/train.py": "print(1)\n"}),
    "task setup_inputs a directory not synced": Case(
        ["run", "t.yaml"], "setup_inputs: deps: no file of that name is synced from",
        {"t.yaml": "workdir: code\nscript: train.py\nsetup: 'true'\nsetup_inputs: [deps]",
         "code/train.py": "print(1)\n", "code/deps/lock.txt": "x", "code/.sortieignore":
         "deps/\n"}),
    "task script that reads as an option": Case(
        ["run", "t.yaml"], "script: '-c': a script's name cannot start with a dash",
        {"t.yaml": "workdir: code\nscript: -c", "code/-c": "print(1)\n"}),
    "task not UTF-8": Case(["run", "t.yaml"], "t.yaml: not UTF-8 text (byte 7",
                           {"t.yaml": b"name: j\xfcrgen"}),
    "task run: ''": Case(["run", "t.yaml"], "run: empty", {"t.yaml": "run: ''"}),
    "task setup: ' '": Case(["run", "t.yaml"], "setup: empty", {"t.yaml": "run: x\nsetup: ' '"}),
    "task run over 32 KiB": Case(["run", "t.yaml"], "run: over 32 KiB",
                                 {"t.yaml": "run: " + "x" * 40_000}),
    "task env value over 4096": Case(["run", "t.yaml"], "env: A: over 4096 characters",
                                     {"t.yaml": "run: x\nenv: {A: " + "x" * 5000 + "}"}),
    "task env over 32 KiB together": Case(
        ["run", "t.yaml"], "env: over 32 KiB of variables together",
        {"t.yaml": "run: x\nenv: {" + ", ".join(f"V{i}: {'x' * 4000}" for i in range(9)) + "}"}),
    "task args over 32 KiB together": Case(
        ["run", "t.yaml"], "args: over 32 KiB together",
        {"t.yaml": "workdir: .\nscript: t.yaml\nargs: [" + ", ".join(["x" * 4000] * 9) + "]"}),
    "task with 5,000 secrets not set": Case(
        ["run", "t.yaml"], "secrets: S0, S1, S2, S3, S4, S5, S6, S7, S8, S9 and 4990 more not set",
        {"t.yaml": "run: x\nsecrets: [" + ", ".join(f"S{i}" for i in range(5000)) + "]"}),
    "the trainer's flag misspelt": Case(["run", "--", "--stpes", "9"],
                                        "-- ARGS (the bundled trainer's): unrecognized"),
    "the trainer's flag a bad value": Case(["run", "--", "--lr", "fast"],
                                           "-- ARGS (the bundled trainer's): argument --lr"),
    "--image with a capital (before: refused by the nodes' podman, the cluster up)": Case(
        ["run", "--image", "MyOrg/train:3"], "--image: 'MyOrg/train:3' is not an image"),
    "--env with no name": Case(["run", "--script", "t.py", "--env", "=x"],
                               "'--env': '=x' names no variable"),
    "--setup without a job (the bundled trainer takes none)": Case(
        ["run", "--setup", "pip install x"], "setup: give `script` or `run`"),
    "an empty task file (before: the bundled trainer ran)": Case(
        ["run", "t.yaml"], "t.yaml: empty (no fields)", {"t.yaml": ""}),
    "a task file of comments only": Case(["run", "t.yaml"], "t.yaml: empty (no fields)",
                                         {"t.yaml": "# script: train.py\n"}),
    "task args as one string (before: 'Input should be a valid tuple')": Case(
        ["run", "t.yaml"], "args: a list ([a, b], or a `- ` line each), not the text '--epochs 3'",
        {"t.yaml": "workdir: .\nscript: t.yaml\nargs: --epochs 3"}),
    "task env as a list": Case(["run", "t.yaml"], "env: a mapping (NAME: value, a line each), "
                               "not a list", {"t.yaml": "run: x\nenv: [A]"}),
    "task image with a capital": Case(["run", "t.yaml"], "image: 'Team/train' is not an image",
                                      {"t.yaml": "run: x\nimage: Team/train"}),
    "--gpu a count no machine has": Case(["run", "--gpu", "H100:3"],
                                         "--gpu H100:3: the catalog's H100 machines have"),
    "--steps 10**23": Case(["run", "--steps", "1" + "0" * 23], "--steps"),
    "workdir / (past the cap)": Case(["run", "--workdir", "/", "--script", "x.py",
                                      "--max-sync-bytes", "1M"], "--workdir /: more than"),
    "workdir whose path is not UTF-8": Case(
        ["run", "--workdir", os.fsdecode(b"caf\xe9"), "--script", "train.py"],
        "--workdir", {os.fsdecode(b"caf\xe9") + "/train.py": "print(1)\n"}),
    "--nodes 600": Case(["run", "--nodes", "600"], "--nodes"),
    "up --nodes 300 locally": Case(["up", "--nodes", "300"], "nodes: 300: a local cluster"),
    "runs dir under a file": Case(["run", "--nodes", "1", "--runs-dir", "f/runs"],
                                  "--runs-dir f/runs: cannot be made", {"f": "a file"}),
    # -- hosts files
    "hosts nested 50,000 deep": Case(["attach", "lab", "--hosts", "h.yaml"],
                                     "nested more than 16 levels", {"h.yaml": f"hosts: {DEEP}"}),
    "hosts 127.000.001.001 (octal to the C library)": Case(
        ["attach", "lab", "--hosts", "h.yaml"], "hosts.1.address: '127.000.001.001': write",
        {"h.yaml": hosts({"address": "127.0.1.1"}, {"address": "127.000.001.001"})}),
    "hosts 2130706689 (a number to the C library)": Case(
        ["attach", "lab", "--hosts", "h.yaml"], "hosts.0.address: '2130706689'",
        {"h.yaml": hosts({"address": "2130706689"})}),
    "hosts ::1 and 0:0::1": Case(
        ["attach", "lab", "--hosts", "h.yaml"], "the same address and port twice (::1 port 22)",
        {"h.yaml": hosts({"address": "::1"}, {"address": "0:0::1"})}),
    "hosts python with a shell in it": Case(
        ["attach", "lab", "--hosts", "h.yaml"], "hosts.0.python: '/usr/bin/python3;id'",
        {"h.yaml": hosts({"address": "127.0.1.1", "python": "/usr/bin/python3;id"})}),
    "hosts known_hosts not UTF-8, bad base64": Case(
        ["attach", "lab", "--hosts", "h.yaml"], "127.0.1.1 has no host_key nor in kh",
        {"h.yaml": hosts({"address": "127.0.1.1", "host_key": None, "known_hosts": "kh"}),
         "id": "key", "kh": b"127.0.1.1 ssh-ed25519 \xff\xfe\n127.0.1.1 ssh-ed25519 AAAA!!\n"
                            b"@revoked 127.0.1.1 ssh-ed25519 AAAA\n"}),
    # -- a stack's outputs
    "outputs nested 50,000 deep": Case(["attach", "lab", "--outputs", "o.json"],
                                       "nested more than 16 levels", {"o.json": DEEP}),
    "outputs train_env name that is shell": Case(
        ["attach", "lab", "--outputs", "o.json"], "stack output train_env",
        {"o.json": outputs(train_env={"X=1;touch ~/pwned;Y": "v"})}),
    "outputs train_env sortie's own": Case(
        ["attach", "lab", "--outputs", "o.json"], "NODE_RANK is set by sortie",
        {"o.json": outputs(train_env={"NODE_RANK": "0"})}),
    "outputs two nodes of one name": Case(
        ["attach", "lab", "--outputs", "o.json"], "nodes: node-0 appears twice",
        {"o.json": outputs(nodes=[node(), node(public_address="127.0.1.2")])}),
    "outputs 127.000.001.001": Case(
        ["attach", "lab", "--outputs", "o.json"], "nodes.1.public_address",
        {"o.json": outputs(nodes=[node(), node(name="node-1",
                                               public_address="127.000.001.001")])}),
    "outputs one node twice": Case(
        ["attach", "lab", "--outputs", "o.json"], "two nodes at 127.0.1.1 port 22",
        {"o.json": outputs(nodes=[node(), node(name="node-1")])}),
    "outputs workdir that is shell": Case(
        ["attach", "lab", "--outputs", "o.json"], "stack output workdir",
        {"o.json": outputs(workdir="/x/attwd;touch /tmp/pwned")}),
    "outputs node workdir that is shell": Case(
        ["attach", "lab", "--outputs", "o.json"], "stack output nodes.0.workdir",
        {"o.json": outputs(nodes=[node(workdir="/x/$(id)")])}),
    "outputs cluster ../../etc": Case(
        ["attach", "lab", "--outputs", "o.json"], "stack output cluster",
        {"o.json": outputs(cluster="../../etc")}),
    "outputs 3,000 nodes": Case(
        ["attach", "lab", "--outputs", "o.json"], "nodes: List should have at most 512",
        {"o.json": outputs(nodes=[node(name=f"node-{i}", public_address=f"10.0.{i // 250}."
                                       f"{i % 250 + 1}") for i in range(3000)])}),
    # -- profiles and --set
    "--set a 1,000-character tag": Case(
        ["plan", "-s", "aws-p3-dev", "--set", "tags={team: " + "x" * 1000 + "}"],
        "sortie:tags: team: not a tag value"),
    "--set a tag key of AWS's": Case(
        ["plan", "-s", "aws-p3-dev", "--set", "tags={'aws:owner': me}"], "sortie:tags"),
    "--set bucketName=../../x": Case(["plan", "-s", "aws-p3-dev", "--set", "bucketName=../../x"],
                                     "sortie:bucketName: '../../x' is not a bucket name"),
    "--set image=ami-$(id)": Case(["plan", "-s", "aws-p3-dev", "--set", "image=ami-$(id)"],
                                  "sortie:image: 'ami-$(id)' is not an AMI id"),
    "--set a GCP image that is shell": Case(
        ["plan", "-s", "gcp-a2-dev", "--set", "image=x;id"], "sortie:image"),
    "--set an Azure image that is shell": Case(
        ["plan", "-s", "azure-nd-dev", "--set", "image=a:b:c:$(id)"], "sortie:image"),
    "--set a CIDR twice": Case(
        ["plan", "-s", "aws-p3-dev", "--set", "sshAllowedCidrs=[10.0.0.0/8, 10.0.0.0/8]"],
        "sortie:sshAllowedCidrs: 10.0.0.0/8 is listed twice"),
    "--set a fallback zone twice": Case(
        ["plan", "-s", "aws-p3-dev", "--set", "fallbackZones=[us-east-1b, us-east-1b]"],
        "sortie:fallbackZones"),
    "--set owner not UTF-8": Case(["plan", "-s", "aws-p3-dev", "--set",
                                   "owner=" + os.fsdecode(b"\xff")], "--set owner: not UTF-8"),
    "--set owner that is shell": Case(["plan", "-s", "aws-p3-dev", "--set", "owner=a;b"],
                                      "sortie:owner"),
    "--set a project that is no project": Case(
        ["plan", "-s", "gcp-a2-dev", "--set", "project=Bad$"], "sortie:project"),
    "--set spotMaxPrice=nan": Case(["plan", "-s", "aws-p3-dev", "--set", "spotMaxPrice=nan"],
                                   "sortie:spotMaxPrice: Input should be a finite number"),
    "--set nested 5,000 deep": Case(["plan", "-s", "aws-p3-dev", "--set",
                                     "tags=" + "[" * 5000], "--set tags: nested"),
    # -- flags
    "reap --hang-timeout 0": Case(["reap", "--hang-timeout", "0"], "--hang-timeout"),
    "ssh -oProxyCommand as NAME": Case(["ssh", "-oProxyCommand=sh -c 'touch pwned'", "node-0"],
                                       "-o: not passed to ssh"),
    "ssh -oProxyCommand alone": Case(["ssh", "-oProxyCommand=sh -c 'touch pwned'"],
                                     "-o: not passed to ssh"),
    "report through a planted symlink": Case(
        ["report", "r1"], "report.html is a symlink; not written through",
        {"runs/r1/run.json": "{}", "outside.html": "not the report's"}),
    "--backend-url ftp://": Case(["down", "--all", "--backend-url", "ftp://"], "--backend-url"),
    "--backend-url http://": Case(["status", "--backend-url", "http://x"], "--backend-url"),
    # -- the environment
    "SORTIE_HOME empty": Case(["status"], "SORTIE_HOME: '' is not", env={"SORTIE_HOME": ""}),
    "SORTIE_HOME a file": Case(["status"], "is not a directory", {"f": "x"},
                               env={"SORTIE_HOME": "{cwd}/f"}),
    "SORTIE_HOME under a file": Case(["down", "x"], "(so ", {"f": "x"},
                                     env={"SORTIE_HOME": "{cwd}/f/home"}),
    "SORTIE_HOME relative": Case(["status"], "SORTIE_HOME: 'home' is relative",
                                 env={"SORTIE_HOME": "home"}),
    "SORTIE_HOME with a newline": Case(["status"], "SORTIE_HOME", env={"SORTIE_HOME": "a\nb"}),
    "SORTIE_LOCAL_CAPACITY=abc": Case(["run", "--nodes", "1"], "SORTIE_LOCAL_CAPACITY: 'abc'",
                                      env={"SORTIE_LOCAL_CAPACITY": "abc"}),
    "SORTIE_LOCAL_NETWORK=bridge": Case(["up", "--nodes", "1"], "SORTIE_LOCAL_NETWORK: 'bridge'",
                                        env={"SORTIE_LOCAL_NETWORK": "bridge"}),
    "SORTIE_LOCAL_NODES=vm": Case(["up", "--nodes", "1"], "SORTIE_LOCAL_NODES: 'vm'",
                                  env={"SORTIE_LOCAL_NODES": "vm"}),
    "SORTIE_LOCAL_LINK_MBIT=fast": Case(["run", "--nodes", "1"], "SORTIE_LOCAL_LINK_MBIT: 'fast'",
                                        env={"SORTIE_LOCAL_LINK_MBIT": "fast"}),
    "--health sometimes": Case(["run", "--health", "sometimes"], "--health"),
    "SORTIE_LOCAL_USD_PER_HOUR=abc": Case(["run", "--max-cost", "5"],
                                          "SORTIE_LOCAL_USD_PER_HOUR: 'abc'",
                                          env={"SORTIE_LOCAL_USD_PER_HOUR": "abc"}),
    "--max-cost 0": Case(["run", "--max-cost", "0"], "--max-cost"),
    "task max_cost: -1": Case(["run", "t.yaml"], "max_cost", {"t.yaml": "max_cost: -1\n"}),
    "--hang-timeout soon": Case(["run", "--hang-timeout", "soon"], "--hang-timeout"),
    # -- third battery (issue 45), a row per kind; each kind is one rule where input enters.
    # A FIFO (or a device) where a file is expected: regular files only, checked before opening.
    "task file a FIFO": Case(["run", "t.yaml"], "t.yaml: not a regular file"),
    "hosts file a FIFO": Case(["attach", "lab", "--hosts", "h.yaml"], "h.yaml: not a regular"),
    "hosts file's known_hosts a FIFO": Case(
        ["attach", "lab", "--hosts", "h.yaml"], "kh: not a regular file",
        {"h.yaml": hosts({"address": "127.0.1.1", "host_key": None, "known_hosts": "kh"}),
         "id": "key"}),
    "outputs file a FIFO": Case(["attach", "lab", "--outputs", "o.json"], "o.json: not a regular"),
    "outputs file /dev/zero": Case(["attach", "lab", "--outputs", "/dev/zero"],
                                   "/dev/zero: not a regular file"),
    "task file /dev/zero": Case(["run", "/dev/zero"], "/dev/zero: not a regular file"),
    # NaN and infinities: finite amounts only.
    "budget set --monthly nan": Case(["budget", "set", "ana", "--monthly", "nan"], "--monthly"),
    "up --max-cost nan": Case(["up", "--max-cost", "nan"], "--max-cost"),
    "run --max-cost inf": Case(["run", "--max-cost", "inf"], "--max-cost"),
    "plan --max-usd-per-hour nan": Case(
        ["plan", "--gpu", "A100:8", "--max-usd-per-hour", "nan"], "--max-usd-per-hour"),
    "task max_cost: .nan": Case(["run", "t.yaml"], "max_cost: Input should be a finite number",
                                {"t.yaml": "max_cost: .nan\n"}),
    "costs --since 999999999d": Case(["costs", "--since", "999999999d"], "--since"),
    # Paths: no kernel tree, no loop, no unknown ~user, not too long, not empty.
    "--runs-dir under /proc": Case(["run", "--runs-dir", "/proc/x"], "--runs-dir: '/proc/x' is "
                                   "in /proc"),
    "--runs-dir under /sys": Case(["run", "--runs-dir", "/sys/x"], "--runs-dir"),
    "--runs-dir too long": Case(["run", "--runs-dir", "x" * 300], "longer than a path may be"),
    "--runs-dir a symlink loop": Case(["run", "--runs-dir", "loop/runs"], "cannot be resolved"),
    "--runs-dir ~nosuchuser": Case(["run", "--runs-dir", "~nosuchuser-x/runs"],
                                   "no such user's home"),
    "SORTIE_HOME under /proc": Case(["status"], "SORTIE_HOME: '/proc/x' is in /proc",
                                    env={"SORTIE_HOME": "/proc/x"}),
    "SORTIE_HOME ~nosuchuser": Case(["status"], "SORTIE_HOME: '~nosuchuser-x/h': no such user",
                                    env={"SORTIE_HOME": "~nosuchuser-x/h"}),
    "SORTIE_HOME too long": Case(["status"], "SORTIE_HOME", env={"SORTIE_HOME": "/" + "y" * 300}),
    "init ''": Case(["init", "", "-s", "aws-p4d"], "DIR: an empty path"),
    "init under /sys": Case(["init", "/sys/x", "-s", "aws-p4d"], "DIR: '/sys/x' is in /sys"),
    "task workdir ~nosuchuser": Case(["run", "t.yaml"], "workdir: '~nosuchuser-x/code': no such",
                                     {"t.yaml": "workdir: ~nosuchuser-x/code\nscript: a.py\n"}),
    "logs through a planted symlink": Case(["logs", "r2"], "reached through a symlink",
                                           {"elsewhere/node-0.log": "not the run's"}),
    # Task values that mean nothing.
    "task nodes: []": Case(["run", "t.yaml"], "nodes", {"t.yaml": "nodes: []"}),
    "task nodes: 0": Case(["run", "t.yaml"], "nodes", {"t.yaml": "nodes: 0"}),
    "task nodes: false": Case(["run", "t.yaml"], "nodes", {"t.yaml": "nodes: false"}),
    "task nodes: ''": Case(["run", "t.yaml"], "nodes", {"t.yaml": "nodes: ''"}),
    "task procs_per_node: 0": Case(["run", "t.yaml"], "procs_per_node",
                                   {"t.yaml": "procs_per_node: 0"}),
    # What a new user types first: a script where the task file goes (before: "a task is a
    # mapping of fields", or a YAML parser's complaint about `def setup():`).
    "a script as the task": Case(["run", "train.py"], "TASK: train.py is a script, not a task "
                                 "file: in its place, `--workdir . --script train.py`",
                                 {"train.py": "import torch\n"}),
    "a shell script as the task": Case(["run", "go.sh"], "`--workdir . --run 'bash go.sh'`",
                                       {"go.sh": "echo hi\n"}),
    "task a key twice": Case(["run", "t.yaml"], "'nodes' is given twice",
                             {"t.yaml": "nodes: 1\nnodes: 8\n"}),
    "task run with a NUL": Case(["run", "t.yaml"], "a NUL character",
                                {"t.yaml": 'run: "echo \\0 hi"\n'}),
    "task env value with a NUL": Case(["run", "t.yaml"], "a NUL character",
                                      {"t.yaml": 'run: x\nenv: {A: "a\\0b"}\n'}),
    "task args with a NUL": Case(["run", "t.yaml"], "a NUL character",
                                 {"t.yaml": 'workdir: .\nscript: t.yaml\nargs: ["a\\0b"]\n'}),
    "the trainer's --lr inf": Case(["run", "--", "--lr", "inf"], "must be a finite number"),
    "the trainer's heads not dividing the width": Case(
        ["run", "--", "--n-heads", "5", "--d-model", "64"], "not divisible by --n-heads 5"),
    # Attach.
    "hosts port: true": Case(["attach", "lab", "--hosts", "h.yaml"], "hosts.0.port",
                             {"h.yaml": hosts({"address": "127.0.1.1", "port": True}),
                              "id": "key"}),
    "outputs a node of index 12345": Case(
        ["attach", "lab", "--outputs", "o.json"], "nodes.0.name",
        {"o.json": outputs(nodes=[node(name="node-12345")])}),
    # Other.
    "SORTIE_PROFILES a FIFO": Case(["plan", "-s", "aws-p4d"], "SORTIE_PROFILES: ",
                                   env={"SORTIE_PROFILES": "pipe"}),
    "SORTIE_PROFILES /dev/zero": Case(["plan", "-s", "aws-p4d"], "SORTIE_PROFILES: '/dev/zero'",
                                      env={"SORTIE_PROFILES": "/dev/zero"}),
    "init --set nodes=0": Case(["init", "proj", "-s", "aws-p4d", "--set", "nodes=0"],
                               "sortie:nodes"),
    # The fourth review's (issue 61).
    **{f"task file that is {text}": Case(["run", "t.yaml"], "t.yaml: a task is a mapping",
                                         {"t.yaml": f"{text}\n"})
       for text in ("[]", "0", "false", '""')},
    "SORTIE_LOCAL_USD_PER_HOUR 1e-300": Case(
        ["up", "--nodes", "1", "--max-cost", "1"], "SORTIE_LOCAL_USD_PER_HOUR: '1e-300'",
        env={"SORTIE_LOCAL_USD_PER_HOUR": "1e-300"}),
    "SORTIE_REHEARSE_DELAYS garbage": Case(
        ["run", "--rehearse", "-s", "aws-p3-dev"], "SORTIE_REHEARSE_DELAYS: 'garbage'",
        env={"SORTIE_REHEARSE_DELAYS": "garbage"}),
    "rehearse preempt --after 99999h": Case(["rehearse", "preempt", "x", "node-1", "--after",
                                             "99999h"], "'--after'"),
    "--backend-url with --rehearse": Case(["run", "--rehearse", "-s", "aws-p3-dev",
                                           "--backend-url", "file:///tmp/x"], "--backend-url"),
    "--slurm with --gpu": Case(["run", "--slurm", "lab", "--gpu", "A100:8"],
                               "--gpu: places the cluster on a cloud"),
    "--set expiresAt in the past": Case(["plan", "-s", "aws-p3-dev", "--set",
                                         "expiresAt=2020-01-01"], "--set expiresAt"),
    "SORTIE_PROFILES holding a FIFO and /dev/zero": Case(
        ["plan", "-s", "fifo"], "--stack: no profile 'fifo'", env={"SORTIE_PROFILES": "prof"}),
}

# What a case may need besides its files: the planted symlink.
def _planted_logs(cwd: Path) -> None:
    (cwd / "runs" / "r2").mkdir(parents=True)
    (cwd / "runs" / "r2" / "logs").symlink_to(cwd / "elsewhere")


SETUPS: dict[str, Callable[[Path], None]] = {
    "report through a planted symlink": lambda cwd: (cwd / "runs/r1/report.html").symlink_to(
        cwd / "outside.html"),
    "task file a FIFO": lambda cwd: os.mkfifo(cwd / "t.yaml"),
    "hosts file a FIFO": lambda cwd: os.mkfifo(cwd / "h.yaml"),
    "hosts file's known_hosts a FIFO": lambda cwd: os.mkfifo(cwd / "kh"),
    "outputs file a FIFO": lambda cwd: os.mkfifo(cwd / "o.json"),
    "SORTIE_PROFILES a FIFO": lambda cwd: os.mkfifo(cwd / "pipe"),
    "SORTIE_PROFILES holding a FIFO and /dev/zero": lambda cwd: (
        (cwd / "prof").mkdir(), os.mkfifo(cwd / "prof" / "Pulumi.fifo.yaml"),
        (cwd / "prof" / "Pulumi.zero.yaml").symlink_to("/dev/zero")),
    "--runs-dir a symlink loop": lambda cwd: (cwd / "loop").symlink_to(cwd / "loop"),
    "logs through a planted symlink": _planted_logs,
}


def tree(root: Path) -> dict[str, bytes | str]:
    """Every file and link under ``root``: what it holds, or where it points."""
    found: dict[str, bytes | str] = {}
    for path in sorted(root.rglob("*")):
        if path.is_symlink():
            found[str(path.relative_to(root))] = f"-> {os.readlink(path)}"
        elif path.is_file():
            found[str(path.relative_to(root))] = path.read_bytes()
    return found


@pytest.mark.parametrize("name", CASES)
@pytest.mark.e2e
def test_a_bad_input_is_one_line_exit_2_and_nothing_is_made(
        name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]):
    case = CASES[name]
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    for relative, content in case.files.items():
        path = cwd / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, errors="surrogateescape")
    SETUPS.get(name, lambda _cwd: None)(cwd)
    before = tree(tmp_path)
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("SORTIE_HOME", str(tmp_path / "home"))
    for variable, value in case.env.items():
        monkeypatch.setenv(variable, value.replace("{cwd}", str(cwd)))

    code = cli.main(case.args)

    err = capsys.readouterr().err
    assert code == case.code, err
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("sortie: error: ") and case.field in err, err
    assert "Traceback" not in err
    assert tree(tmp_path) == before, "a bad input made, changed or removed a file"


@pytest.mark.unit
def test_a_relative_sortie_home_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Fourth review (issue 61), Low 17: a relative SORTIE_HOME names another home from every
    other directory: `SORTIE_HOME=rel sortie up --name relh` in one and `sortie down relh` from
    another said "no sortie named 'relh'" while its node ran. Refused, saying how."""
    from sortie.core.home import sortie_home

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SORTIE_HOME", "state")
    with pytest.raises(UsageError, match=r"^SORTIE_HOME: 'state' is relative.*\$PWD/state"):
        sortie_home()
    monkeypatch.setenv("SORTIE_HOME", "~/state")
    assert sortie_home() == Path.home() / "state"
    monkeypatch.delenv("SORTIE_HOME")
    assert sortie_home() == Path.home() / ".sortie"


@pytest.mark.unit
def test_a_date_in_set_is_text_as_pulumi_config_is(capsys: pytest.CaptureFixture[str]):
    """Before: YAML read `expiresAt=2030-01-01` as a date, and the plan ended in a traceback
    (a date is not JSON)."""
    code = cli.main(["plan", "-s", "aws-p3-dev", "--set", "expiresAt=2030-01-01", "--json"])
    assert code == 0, capsys.readouterr().err
    assert "2030-01-01T00:00Z" in capsys.readouterr().out  # the sortie-expires-at tag


@pytest.mark.parametrize(("change", "field"), [
    ({"address": "-oProxyCommand=touch pwned"}, "nodes.0.address"),
    ({"user": "-oProxyCommand=x"}, "nodes.0.user"),
    ({"name": "../../x"}, "nodes.0.name"),
    ({"host_key": "ssh-ed25519 not-base64!"}, "nodes.0.host_key"),
    ({"workdir": "/srv/../../etc"}, "nodes.0.workdir"),
    ({"python": "python3\n; id"}, "nodes.0.python"),
])
@pytest.mark.unit
def test_a_tampered_inventory_is_refused_as_damaged(tmp_path: Path, change: dict, field: str):
    """A state file is untrusted input too: each field is checked as it is read back."""
    from sortie.core.inventory import Inventory
    from sortie.core.statefile import CorruptStateError

    node = {"name": "node-0", "address": "127.0.1.1", "port": 22, "user": "u", "key_path": "/k",
            "host_key": HOST_KEY, "gpus": 0, "private_address": "127.0.1.1", "workdir": "/w"}
    path = tmp_path / "inventory.json"
    path.write_text(json.dumps({"cluster_id": "c", "backend": "local",
                                "nodes": [{**node, **change}]}))
    with pytest.raises(CorruptStateError, match=field):
        Inventory.load(path)


@pytest.mark.unit
def test_a_state_file_with_a_negative_pid_is_a_broken_row_not_a_crash(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    """Third battery: a controller.json with `"pid": -1` and a fresh heartbeat crashed
    `status`, `reap` and `watch` (ValueError: pid must be a positive integer)."""
    import time

    state = tmp_path / "home" / "clusters" / "neg"
    state.mkdir(parents=True)
    (state / "controller.json").write_text(json.dumps(
        {"host": "h", "pid": -1, "started": time.time(), "heartbeat": time.time()}))
    monkeypatch.setenv("SORTIE_HOME", str(tmp_path / "home"))
    for args in (["status", "--json"], ["reap", "--dry-run"], ["watch", "neg"]):
        code = cli.main(args)
        out, err = capsys.readouterr()
        assert "Traceback" not in err and code in (0, 1, 2), (args, code, err)
        assert "neg" in out + err, (args, out, err)
        if args[0] != "watch":  # (watch: "sortie 'neg' is broken", exit 2)
            assert "pid: Input should be greater than 0" in out + err, (args, out, err)


@pytest.mark.unit
def test_destroy_stack_without_a_terminal_or_stdin_asks_for_yes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    """Before: with stdin closed, `down NAME --destroy-stack` ended in AttributeError."""
    monkeypatch.setenv("SORTIE_HOME", str(tmp_path / "home"))
    monkeypatch.setattr("sys.stdin", None)
    code = cli.main(["down", "fleet", "--destroy-stack"])
    err = capsys.readouterr().err
    assert code == 2 and "add --yes to confirm" in err and "Traceback" not in err, err


@pytest.mark.unit
def test_a_scripts_own_flag_before_the_dashes_is_told_where_it_goes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    """A README user's `sortie run --script train.py --epochs 3` (the `--` left out): before,
    click's "No such option '--epochs'. (Did you mean ... '--steps'?)" and nothing more."""
    monkeypatch.setenv("SORTIE_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    for argv, command in ((["run", "--script", "train.py", "--epochs", "3"], "run"),
                          (["run", "--setup", "python prep.py", "--script", "train.py",
                            "--epochs", "3"], "run"),
                          (["exec", "dev", "--lr=0.1", "--", "--x"], "exec")):
        assert cli.main(argv) == 2
        err = capsys.readouterr().err.strip()
        flag = argv[-2] if command == "run" else "--lr"
        assert len(err.splitlines()) == 1 and f"No such option '{flag}'" in err, err
        assert err.endswith(f"A flag of your job's own goes after `--`: `sortie {command} ... "
                            f"-- {flag} ...`."), err
    assert not (tmp_path / "home").exists(), "nothing was started"


@pytest.mark.unit
def test_a_command_typed_as_words_is_told_where_it_goes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    """A new user's `sortie run python train.py` (or after `--`): before, click's "Got
    unexpected extra argument (train.py)", or the bundled trainer's "unrecognized arguments"."""
    monkeypatch.setenv("SORTIE_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    for argv, said in ((["run", "python", "train.py"], "Got unexpected extra argument (train.py)"),
                       (["exec", "dev", "python", "train.py", "--lr", "3"],
                        "No such option '--lr'"),
                       (["run", "--", "python", "train.py"],
                        "unrecognized arguments: python train.py")):
        assert cli.main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and said in err, err
        assert "--run 'python train.py" in err and "--script train.py" in err, err
    assert cli.main(["run", "--", "--nope", "3"]) == 2  # a flag: the trainer's own message
    assert "--run" not in capsys.readouterr().err
    assert not (tmp_path / "home").exists(), "nothing was started"


@pytest.mark.parametrize("columns", ["0", "5", "abc", "-3"])
@pytest.mark.unit
def test_a_columns_nobody_could_read_is_ignored(
        columns: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]):
    """Before: COLUMNS=0 made `status` and `profiles` print nothing, with exit 0."""
    monkeypatch.setenv("SORTIE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("COLUMNS", columns)
    assert cli.main(["profiles"]) == 0
    assert "aws-p4d" in capsys.readouterr().out
    assert cli.main(["status"]) == 0
    assert "no sorties" in capsys.readouterr().out


@pytest.mark.unit
def test_a_fifo_for_budgets_never_hangs_a_command(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    """Before: a FIFO at $SORTIE_HOME/budgets.json hung `status` and `budget list`."""
    home = tmp_path / "home"
    home.mkdir()
    os.mkfifo(home / "budgets.json")
    monkeypatch.setenv("SORTIE_HOME", str(home))
    assert cli.main(["budget", "list"]) == 0
    assert "budgets.json: not a regular file: skipped" in capsys.readouterr().out
    assert cli.main(["status"]) == 0


@pytest.mark.unit
def test_a_directory_where_a_state_file_belongs_is_one_line_not_a_traceback(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    """Fourth review (issue 61), Low 17: `budgets.json` a directory: IsADirectoryError."""
    home = tmp_path / "home"
    (home / "budgets.json").mkdir(parents=True)
    monkeypatch.setenv("SORTIE_HOME", str(home))
    code = cli.main(["budget", "set", "alice", "--monthly", "5"])
    err = capsys.readouterr().err
    assert code == 1 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert "budgets.json is a directory, not the file sortie keeps there" in err
    assert (home / "budgets.json").is_dir()


@pytest.mark.unit
def test_a_failed_commands_output_is_quoted_as_one_capped_line():
    """What a node's tool said when it failed is quoted in a message: its last line (where tools
    say why), capped, since a node's output is untrusted; the default where it said nothing."""
    assert last_line("rsync: warning\nrsync error: connection unexpectedly closed\n\n",
                     "exit 12") == "rsync error: connection unexpectedly closed"
    assert last_line(" \n\t\n", "exit 12") == "exit 12"
    assert last_line("x" * 10_000, "?") == "x" * 300
    assert last_line("y" * 500, "?", 200) == "y" * 200
