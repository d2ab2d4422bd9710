"""The command line's shared options and value types, each declared once."""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from sortie.bootstrap.choices import DEFAULT_COLLECT_BYTES, DEFAULT_MAX_BYTES, HEALTH_LEVELS
from sortie.cli.flag_types import Duration, bundled
from sortie.cli.slurm_options import slurm
from sortie.core.errors import UsageError
from sortie.core.inventory import MAX_NODES
from sortie.core.job import COMMAND_HINT
from sortie.core.naming import NAME
from sortie.core.sizes import SIZE_UNITS, human_bytes
from sortie.core.userfile import user_path
from sortie.fleet.launch_ask import LaunchAsk
from sortie.infra.offers import INTERCONNECTS, GpuAsk

if TYPE_CHECKING:  # Slurm's site models load only with --slurm
    from sortie.stacks.slurm.slurm_sites import SlurmRequest

F = TypeVar("F", bound=Callable[..., Any])


class ByteSize(click.ParamType):
    """A size in bytes: 1048576, 512K, 500M, 50G, 2T (powers of 1024)."""

    name = "SIZE"

    def convert(self, value: object, param: click.Parameter | None,
                ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        match = re.fullmatch(r"(\d+)\s*([KMGT]?)I?B?", str(value).strip().upper())
        if not match or int(match[1]) == 0:
            self.fail(f"{value!r} is not a size like 500M or 50G", param, ctx)
        return int(match[1]) * SIZE_UNITS.get(match[2], 1)


class EnvVar(click.ParamType):
    """NAME=VALUE, or NAME alone: the caller's own value, read as a task's `NAME: null` is."""

    name = "NAME[=VALUE]"

    def convert(self, value: object, param: click.Parameter | None,
                ctx: click.Context | None) -> tuple[str, str | None]:
        if isinstance(value, tuple):
            return value
        name, equals, text = str(value).partition("=")
        if not name:
            self.fail(f"{value!r} names no variable (NAME=VALUE, or NAME for yours)", param, ctx)
        return name, text if equals else None


class Money(click.ParamType):
    """Dollars (or dollars an hour): a finite number from ``low`` to ``high``. click's
    FloatRange lets NaN through (every comparison with it is false) and `inf` past its end."""

    name = "USD"

    def __init__(self, low: float, high: float, low_open: bool = False) -> None:
        self.low, self.high, self.low_open = low, high, low_open

    def convert(self, value: object, param: click.Parameter | None,
                ctx: click.Context | None) -> float:
        try:
            number = float(str(value).strip().lstrip("$").replace(",", ""))
        except ValueError:
            self.fail(f"{str(value)[:40]!r} is not an amount in dollars", param, ctx)
        if not math.isfinite(number) or number > self.high or number < self.low or \
                (self.low_open and number == self.low):
            least = f"over {self.low:g}" if self.low_open else f"at least {self.low:g}"
            self.fail(f"{str(value)[:40]!r}: give a number {least} and at most {self.high:g}",
                      param, ctx)
        return number


nodes = click.option("--nodes", "-n", type=click.IntRange(1, MAX_NODES), default=None,
                     help="Number of nodes. Default: 2 locally, the profile's on a cloud.")
as_json = click.option("--json", "as_json", is_flag=True,
                       help="Print one JSON document on stdout (progress goes to stderr).")
name = click.option("--name", help="Cluster / run id (lowercase letters, digits, dashes). "
                    "Default: a timestamp.")
class UserDir(click.ParamType):
    """A directory path for sortie to read or write (`userfile.user_path`'s rule: no kernel
    tree, no loop, no unknown ``~user``, not too long)."""

    name = "DIR"

    def convert(self, value: object, param: click.Parameter | None,
                ctx: click.Context | None) -> Path:
        field = param.get_error_hint(ctx) if param is not None and ctx is not None else "DIR"
        return user_path(str(value), field.strip("'\""), absolute_wanted=False)


class BackendUrl(click.ParamType):
    """A Pulumi state backend sortie can read and write: file://, s3://, gs://, azblob://."""

    name = "URL"

    def convert(self, value: object, param: click.Parameter | None,
                ctx: click.Context | None) -> str:
        text = str(value)
        if not re.fullmatch(r"(file|s3|gs|azblob)://[^\s]+", text) or not text.isprintable():
            self.fail(f"{text[:100]!r} is not a state backend URL (file://, s3://, gs://, "
                      "azblob://)", param, ctx)
        return text


def backend_url_option(help_text: str) -> Callable[[F], F]:
    return click.option("--backend-url", type=BackendUrl(), help=help_text)


backend_url = backend_url_option(
    "Pulumi state backend for cloud stacks (file://, s3://, gs://, azblob://). Default: a local "
    "file backend in $SORTIE_HOME/pulumi/state.")


def stack(required: bool = False) -> Callable[[F], F]:  # (optional for `run`: local nodes)
    return click.option("--stack", "-s", metavar="PROFILE", required=required,
                        help="Stack profile: stacks/profiles/Pulumi.<PROFILE>.yaml, e.g. aws-p4d. "
                             "Launching one needs the Pulumi CLI and the cloud's credentials "
                             "(`plan` needs neither; `--rehearse` runs it here).")


rehearse = click.option(
    "--rehearse", is_flag=True,
    help="Rehearse the --stack profile's cloud sortie here, for nothing: one booted local node "
         "per planned node, each handed the user data the profile's program declares, with "
         "stand-ins for the cloud's metadata service and secret store (root; `sortie images "
         "--build` once). The Pulumi engine and the provider are not run.")
overrides = click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
                         help="Override a profile setting, e.g. --set zone=us-east-1b or "
                              "--set nodes=16. Repeatable.")
runs_dir = click.option("--runs-dir", type=UserDir(),
                        default="runs", show_default=True, help="Where runs/<id>/ is written.")
max_recoveries = click.option(
    "--max-recoveries", type=click.IntRange(min=0), default=2, show_default=True,
    help="Times a lost node is replaced and training resumed before giving up.")
health = click.option(
    "--health", type=click.Choice(HEALTH_LEVELS), default="quick", show_default=True,
    help="The health gate before training: each node's GPUs (ECC, XID, throttling, PCIe, DCGM), "
    "EFA/InfiniBand, then the network across nodes (a slow node is found). full: DCGM level 2 "
    "and large messages, held to the catalog's bandwidth. A bad node is replaced (own clusters) "
    "or named and refused (held, attached).")
hang_timeout = click.option(
    "--hang-timeout", "hang_timeout_s", type=Duration(min_s=0), default="10m", show_default=True,
    help="No new log line from any node for this long: each node is asked which others it "
    "reaches over the job's network. One the others cannot reach is replaced and training "
    "resumes from the newest checkpoint; if every node reaches the others the job is left "
    "running (it may work without printing) and asked again after as long. 0: never asks.")
BUDGET_HELP = ("A hard budget in dollars, counted at the launch terms (nodes x $/h, from launch; "
               "local nodes: $SORTIE_LOCAL_USD_PER_HOUR), what stopping and teardown will cost "
               "included. ")


def budget(ends: str) -> Callable[[F], F]:
    """--max-cost, its help saying what reaching it ``ends``."""
    return click.option("--max-cost", "max_cost", type=Money(0.01, 1e7), default=None,
                        metavar="USD", help=BUDGET_HELP + ends)


max_cost = budget("A warning at 80 %; at 100 % the job is stopped as a preemption stops it "
                  "(the bundled trainer checkpoints), collected and torn down; exit 1.")
max_cost_exec = budget("A warning at 80 %; at 100 % the job is stopped as a preemption stops "
                       "it and collected; exit 1. The cluster stays up (`sortie down NAME` "
                       "ends it; `up --max-cost` gives the cluster a budget of its own).")
max_cost_held = budget("Spent, the cluster ends itself (local nodes tear down; a cloud "
                       "cluster's TTL is cut to what the budget buys).")
max_artifacts = click.option(
    "--max-artifacts", "max_artifact_bytes", type=ByteSize(),
    default=human_bytes(DEFAULT_MAX_BYTES), show_default=True,
    help="Most bytes collected from the nodes and the bucket together (e.g. 500M, 2T); past it "
    "collection stops and the bucket is kept.")


class PassthroughCommand(click.Command):
    """Everything after the first `--` goes, untouched, to the job (the user's script or the
    bundled trainer), in ``ctx.meta["passthrough"]``: a job argument that looks like a task
    file is never taken for one."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if "--" in args:
            at = args.index("--")
            args, ctx.meta["passthrough"] = args[:at], tuple(args[at + 1:])
        else:
            ctx.meta["passthrough"] = ()
        words = list(args)  # click's parser takes from ``args`` as it goes
        try:
            return super().parse_args(ctx, args)
        except click.NoSuchOption as exc:  # a README user's `--script train.py --epochs 3`
            hint = (COMMAND_HINT if _typed_command(words, self.params) else "A flag of your "
                    f"job's own goes after `--`: `sortie {ctx.info_name} ... -- "
                    f"{exc.option_name} ...`.")
            raise click.UsageError(f"{exc.format_message()} {hint}", ctx) from None
        except click.UsageError as exc:  # `sortie run python train.py`: a command, as typed
            if not exc.format_message().startswith("Got unexpected extra argument"):
                raise
            raise click.UsageError(f"{exc.format_message()}. {COMMAND_HINT}", ctx) from None


def _typed_command(args: list[str], params: list[click.Parameter]) -> bool:
    """Whether ``args`` hold a script's name as a word of its own, not an option's value
    (`--script train.py`, `--setup 'python prep.py'`): `sortie run python train.py --lr 3`."""
    valued = {name for param in params if isinstance(param, click.Option) and not param.is_flag
              for name in param.opts}
    return any(word.endswith(SCRIPT_SUFFIXES) and not word.startswith("-")
               and not (at and args[at - 1] in valued) for at, word in enumerate(args))


class WordsCommand(click.Command):
    """Every word goes to the command as it is, in ``ctx.meta["words"]``: `-oProxyCommand=sh` is
    a word, not a bundle of short flags (one of them `-h`). Only a first word of -h or --help
    asks for help."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args[:1] in (["-h"], ["--help"]):
            return super().parse_args(ctx, args)
        ctx.meta["words"] = tuple(args)
        return super().parse_args(ctx, [])


SCRIPT_SUFFIXES = (".py", ".sh")  # a script given where a task file goes


class TaskFile(click.ParamType):
    """A task file, or a run's id in the run history: the ``task.yaml`` that run kept."""

    name = "task"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Path:
        from sortie.core.home import sortie_home
        from sortie.engine.job_files import TASK_RECORD
        from sortie.rundir.history import find_run
        path = Path(value)
        if path.suffix in SCRIPT_SUFFIXES:  # what a new user types first: `sortie run train.py`
            how = (f"--script {path.name}" if path.suffix == ".py" else
                   f"--run 'bash {path.name}'")
            raise UsageError(f"TASK: {value} is a script, not a task file: in its place, "
                             f"`--workdir {shlex.quote(str(path.parent))} {how}` runs it on "
                             "every node" + (" with torchrun" if path.suffix == ".py" else ""))
        entry = None if path.exists() or not NAME.fullmatch(str(value)) else \
            find_run(sortie_home(), str(value))
        if entry is None:
            return path  # (a file, or read as one: "no such file" names it)
        recorded = Path(entry.directory) / TASK_RECORD
        if not recorded.is_file():
            raise UsageError(f"TASK: run {value} ran the bundled trainer: it kept no task.yaml "
                             f"(its flags are in {entry.directory}/run.json)")
        return recorded


dry_run = click.option("--dry-run", is_flag=True, help="Make every check a run makes before "
                       "it starts (flags, task, workdir, secrets, budget, the place's own "
                       "answer) and say what it would do: where, which files go, the setup, the "
                       "job, where results land. Nothing is started.")
task_file = click.argument("task_file", required=False, metavar="[TASK.yaml|RUN]",
                           type=TaskFile())
workdir = click.option("--workdir", type=UserDir(),
                       help="Your code: synced to every node (.sortieignore or .gitignore "
                            "rules; .git, Python environments, __pycache__ never). With --script "
                            "and no task file: the current directory unless given.")
script = click.option("--script", metavar="FILE",
                      help="Run FILE (in --workdir) with torchrun on every node; its arguments "
                           "after `--`.")
setup_line = click.option("--setup", metavar="COMMAND",
                          help="Run this shell command on every node before the job (as a "
                               "task's `setup:`), e.g. 'pip install -r requirements.txt': in "
                               "the job's own environment (or its image), cached on each node "
                               "until it, its `setup_inputs` or `env` change.")
env_vars = click.option("--env", "env", multiple=True, type=EnvVar(),
                        help="A variable for the job and its setup on every node, over the "
                             "task's `env` (repeatable): NAME=VALUE, or NAME to pass this "
                             "shell's value, never recorded (as a task's `NAME: null`). The "
                             "bundled trainer takes NAME=VALUE (NCCL_DEBUG=INFO).")
run_line = click.option("--run", "run", metavar="COMMAND",
                        help="Run this shell command on every node instead of a script (as a "
                             "task's `run:`): your own torchrun line, or any command, e.g. "
                             "'nvidia-smi' (SORTIE_* variables say each node's place).")
artifact = click.option("--artifact", "artifacts", multiple=True, metavar="GLOB",
                        help="Files under the workdir to bring back verified (repeatable).")
image = click.option("--image", metavar="IMAGE",
                     help="Run every rank in this container image ([registry/]name[:tag], "
                          "pulled on every node; recorded by digest): torchrun, your script "
                          "and setup run in it (docs/your-job.md, 'Images').")
rerun_setup = click.option("--rerun-setup", is_flag=True,
                           help="Run the task's setup even where it is cached.")
max_sync = click.option("--max-sync-bytes", type=ByteSize(), default="1G", show_default=True,
                        help="Refuse to sync a workdir larger than this (data belongs in the "
                             "bucket).")




def collected_new_bytes(collect_max: int, no_collect: bool) -> int:
    """How much of what a user's job wrote, unnamed by `artifacts`, a run collects (0: none)."""
    return 0 if no_collect else collect_max


# What a user's job writes in its workdir is collected by default, up to a cap: one value.
collect_new = bundled("collect_new_bytes", collected_new_bytes, (
    click.option("--collect-max", type=ByteSize(), default=human_bytes(DEFAULT_COLLECT_BYTES),
                 show_default=True, help="Your job's files: what it created or changed in its "
                 "workdir on any node after it started is brought back verified (smallest "
                 "first) up to this much; what is left is named, with its size. Files your "
                 "--artifact globs name always come back."),
    click.option("--no-collect", is_flag=True, help="Bring back only the --artifact files "
                 "(and the logs); name the rest of what the job wrote.")))


GPU_FLAGS = (
    click.option("--gpu", metavar="MODEL[:N]", help="Instead of a profile: N GPUs of "
                 "MODEL per node (e.g. A100:8), on the cheapest catalog machine of any "
                 "cloud and region (`sortie plan --gpu` lists them; `run`/`up` fall "
                 "back to the next one when a launch gets no capacity)."),
    click.option("--spot", is_flag=True, help="With --gpu: at the spot price (workers "
                 "on spot, the head on-demand)."),
    click.option("--max-usd-per-hour", type=Money(0, 1e7, low_open=True), default=None,
                 metavar="USD", help="With --gpu: only clusters at most this much an "
                 "hour."),
    click.option("--interconnect", type=click.Choice(INTERCONNECTS), default="any",
                 show_default=True, help="With --gpu: only machines with this network "
                 "between nodes."))


def gpu_ask(gpu: str | None, spot: bool, max_usd_per_hour: float | None,
            interconnect: str) -> GpuAsk | None:
    """The --gpu flags as one request (None without --gpu, whose narrowing flags are then
    refused in one line)."""
    if gpu is None:
        if spot or max_usd_per_hour is not None or interconnect != "any":
            raise UsageError("--spot, --max-usd-per-hour, --interconnect: apply with --gpu")
        return None
    return GpuAsk(gpu, spot, max_usd_per_hour, interconnect)


# --gpu and the flags that narrow it, as one `ask: GpuAsk | None`: `plan` lists the offers,
# `run` and `up` launch the cheapest (falling back to the next).
gpu_request = bundled("ask", gpu_ask, GPU_FLAGS)




@dataclass(frozen=True)
class JobFlags:
    """What a job runs, as `run` and `exec` were told it (a task file's fields fill the rest)."""

    task_file: Path | None
    workdir: Path | None
    script: str | None
    run: str | None
    setup: str | None
    env: tuple[tuple[str, str | None], ...]
    artifacts: tuple[str, ...]
    image: str | None
    rerun_setup: bool
    max_sync_bytes: int


# The flags that say what a job runs, shared by `run` and `exec`, as one `job: JobFlags`.
job = bundled("job", JobFlags, (task_file, workdir, script, run_line, setup_line, env_vars,
                                   artifact, image, rerun_setup, max_sync))


def launch_ask(nodes: int | None, stack: str | None, rehearse: bool, ask: GpuAsk | None,
               slurm: SlurmRequest | None, overrides: tuple[str, ...], backend_url: str | None,
               name: str | None) -> LaunchAsk:
    return LaunchAsk(stack=stack, overrides=overrides, backend_url=backend_url, name=name,
                     gpu=ask, nodes=nodes, rehearse=rehearse, slurm=slurm)


# Where a new cluster goes and its size (`run`, `up`): one value, `launch`.
launch = bundled("launch", launch_ask, (nodes, stack(), rehearse, gpu_request, slurm, overrides,
                                        backend_url, name))
