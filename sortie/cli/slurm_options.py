"""`--slurm` and the flags that shape its allocation, as one `slurm: SlurmRequest | None` (`run`,
`up`); `attach --slurm`'s partition prices."""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING

import click

from sortie.cli.flag_types import Duration, bundled
from sortie.core.errors import UsageError

if TYPE_CHECKING:
    from sortie.stacks.slurm.slurm_sites import SlurmRequest

SLURM_WORD = r"[A-Za-z0-9_.+-]{1,64}"
# Each shaping flag's value, as Slurm writes it.
SHAPES = {"--partition": rf"{SLURM_WORD}(,{SLURM_WORD}){{0,15}}", "--account": SLURM_WORD,
          "--qos": SLURM_WORD, "--reservation": SLURM_WORD, "--time": r"[0-9][0-9:-]{0,15}",
          "--mem": r"[0-9]{1,9}[KMGT]?", "--constraint": r"[A-Za-z0-9_.&|\[\]*,:()-]{1,200}",
          "--exclude": r"[A-Za-z0-9_.,\[\]-]{1,300}"}
# What sortie sets itself (its shape, its output, its signal), or has a flag of its own for:
# an `--sbatch-arg` of these is refused, naming the flag to use instead where there is one.
OURS = {"--nodes": "--nodes", "-N": "--nodes", "--partition": "--partition", "-p": "--partition",
        "--gres": "--gpus-per-node", "--gpus-per-node": "--gpus-per-node", "--time": "--time",
        "-t": "--time", "--account": "--account", "-A": "--account", "--qos": "--qos",
        "-q": "--qos", "--mem": "--mem", "--cpus-per-task": "--cpus-per-task",
        "-c": "--cpus-per-task", "--exclusive": "--exclusive", "--constraint": "--constraint",
        "-C": "--constraint", "--reservation": "--reservation", "--exclude": "--exclude",
        "-x": "--exclude"}
SORTIES_OWN = ("--ntasks", "-n", "--ntasks-per-node", "--job-name", "-J", "--output", "-o",
               "--error", "-e", "--chdir", "-D", "--wrap", "--signal", "--parsable",
               "--test-only", "--array", "-a", "--wait", "-W", "--hold", "-H", "--nodelist",
               "-w", "--mem-per-cpu", "--mem-per-gpu", "--gpus", "-G", "--ntasks-per-gpu",
               "--export", "--open-mode", "--kill-on-invalid-dep", "--requeue", "--no-requeue")
SLURM_FLAGS = (
    click.option("--slurm", "slurm_site", metavar="NAME", help="Allocate on Slurm cluster NAME "
                 "(`sortie attach NAME --slurm`): one batch job holds the nodes; every phase "
                 "runs in it through srun."),
    click.option("--partition", metavar="P[,P...]", help="With --slurm: the partition, or "
                 "several (Slurm starts it in whichever can first; default: the cluster's "
                 "default)."),
    click.option("--gpus-per-node", type=click.IntRange(0, 64), default=0, help="With "
                 "--slurm: GPUs per node (--gres=gpu:G)."),
    click.option("--time", "time_limit", metavar="LIMIT", help="With --slurm: the "
                 "allocation's time limit, as Slurm writes it (2:00:00, 1-0, 90)."),
    click.option("--account", metavar="A", help="With --slurm: the account it is charged to."),
    click.option("--qos", metavar="Q", help="With --slurm: the quality of service."),
    click.option("--mem", metavar="SIZE", help="With --slurm: memory per node (64G, 500M); "
                 "where a site counts memory, its default may be too little for the ranks."),
    click.option("--cpus-per-task", type=click.IntRange(1, 4096), default=None, help="With "
                 "--slurm: CPUs per node (one task a node holds them all: every rank, and the "
                 "agent)."),
    click.option("--exclusive", is_flag=True, help="With --slurm: whole nodes, shared with no "
                 "other job."),
    click.option("--constraint", metavar="FEATURES", help="With --slurm: nodes with these "
                 "features (a100&ib)."),
    click.option("--reservation", metavar="R", help="With --slurm: run in this reservation."),
    click.option("--exclude", metavar="NODES", help="With --slurm: never these nodes "
                 "(n[3-4],gpu7)."),
    click.option("--sbatch-arg", "sbatch_args", multiple=True, metavar="--OPTION[=VALUE]",
                 help="With --slurm: passed to sbatch as it is (repeatable); refused where it "
                 "would fight what sortie sets (its nodes, tasks, output, signal) or has a flag "
                 "of its own."),
    click.option("--queue-timeout", "queue_timeout_s", type=Duration(), default=None,
                 metavar="DURATION", help="With --slurm: give up (and cancel it) if the "
                 "allocation waits longer than this in the queue (default: as long as it takes; "
                 "Ctrl-C cancels). Its job id, Slurm's reason and estimated start are shown "
                 "while it waits."))


def sbatch_arg(given: str) -> str:
    """One `--sbatch-arg`, checked: a long option of sbatch's, not one sortie sets itself."""
    if not re.fullmatch(r"--[a-z][a-z0-9-]{1,40}(=[^\s;&|`$<>]{0,200})?", given):
        raise UsageError(f"--sbatch-arg: {given[:80]!r}: give one of sbatch's long options, "
                         "--option or --option=value")
    option = given.partition("=")[0]
    if option in OURS:
        raise UsageError(f"--sbatch-arg: {option}: sortie has a flag for it, {OURS[option]}")
    if option in SORTIES_OWN:
        raise UsageError(f"--sbatch-arg: {option}: sortie sets it itself (one task a node, its "
                         "own job name, output and signal)")
    return given


def slurm_request(slurm_site: str | None, partition: str | None, gpus_per_node: int,
                  time_limit: str | None, account: str | None, qos: str | None,
                  mem: str | None = None, cpus_per_task: int | None = None,
                  exclusive: bool = False, constraint: str | None = None,
                  reservation: str | None = None, exclude: str | None = None,
                  sbatch_args: tuple[str, ...] = (), queue_timeout_s: float | None = None
                  ) -> SlurmRequest | None:
    """The --slurm flags as one request (None without --slurm, whose flags are then refused)."""
    given = {"--partition": partition, "--time": time_limit, "--account": account,
             "--qos": qos, "--mem": mem, "--constraint": constraint,
             "--reservation": reservation, "--exclude": exclude}
    if slurm_site is None:
        if any(given.values()) or gpus_per_node or cpus_per_task or exclusive or sbatch_args \
                or queue_timeout_s is not None:
            raise UsageError(f"{', '.join([*given, '--gpus-per-node', '--cpus-per-task'])}, "
                             "--exclusive, --sbatch-arg, --queue-timeout: apply with --slurm")
        return None
    for flag, value in given.items():
        if value is not None and not re.fullmatch(SHAPES[flag], value):
            raise UsageError(f"{flag}: {value[:80]!r} is not as Slurm writes it" + (
                " (2:00:00, 1-0)" if flag == "--time" else " (64G, 500M)" if flag == "--mem"
                else ""))
    # Slurm's site models load only with --slurm: `exec` on a local cluster never pays for them
    from sortie.stacks.slurm.slurm_sites import SlurmAsk, SlurmRequest

    ask = SlurmAsk(partition, gpus_per_node, time_limit, account, qos, mem, cpus_per_task or 0,
                   exclusive, constraint, reservation, exclude,
                   tuple(sbatch_arg(arg) for arg in sbatch_args))
    return SlurmRequest(slurm_site, ask, queue_timeout_s)


def partition_prices(given: tuple[str, ...]) -> dict[str, float]:
    """`--usd-per-gpu-hour PARTITION=USD`, each checked."""
    prices = {}
    for entry in given:
        partition, _, usd = entry.partition("=")
        try:
            price = float(usd)
        except ValueError:
            price = math.nan
        if not re.fullmatch(SLURM_WORD, partition) or not 0 <= price < 1e6:
            raise UsageError(f"--usd-per-gpu-hour: {entry[:80]!r}: write PARTITION=USD "
                             "(gpu=2.5)")
        prices[partition] = price
    return prices


# --slurm and its flags, as one `slurm: SlurmRequest | None` (`run`, `up`).
slurm = bundled("slurm", slurm_request, SLURM_FLAGS)
