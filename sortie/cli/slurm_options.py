"""`--slurm` and the flags that shape its allocation, as one `slurm: SlurmRequest | None` (`run`,
`up`); `attach --slurm`'s partition prices."""

from __future__ import annotations

import math
import re

import click

from sortie.cli.flag_types import Duration, bundled
from sortie.core.errors import UsageError
from sortie.stacks.slurm.slurm_sites import SlurmAsk, SlurmRequest

SLURM_WORD = r"[A-Za-z0-9_.+-]{1,64}"
SLURM_FLAGS = (
    click.option("--slurm", "slurm_site", metavar="NAME", help="Allocate on Slurm cluster NAME "
                 "(`sortie attach NAME --slurm`): one batch job holds the nodes; every phase "
                 "runs in it through srun."),
    click.option("--partition", metavar="P", help="With --slurm: the partition (default: "
                 "the cluster's default)."),
    click.option("--gpus-per-node", type=click.IntRange(0, 64), default=0, help="With "
                 "--slurm: GPUs per node (--gres=gpu:G)."),
    click.option("--time", "time_limit", metavar="LIMIT", help="With --slurm: the "
                 "allocation's time limit, as Slurm writes it (2:00:00, 1-0, 90)."),
    click.option("--account", metavar="A", help="With --slurm: the account it is charged to."),
    click.option("--qos", metavar="Q", help="With --slurm: the quality of service."),
    click.option("--queue-timeout", "queue_timeout_s", type=Duration(), default=None,
                 metavar="DURATION", help="With --slurm: give up (and cancel it) if the "
                 "allocation waits longer than this in the queue (default: as long as it takes; "
                 "Ctrl-C cancels). Its job id, Slurm's reason and estimated start are shown "
                 "while it waits."))


def slurm_request(slurm_site: str | None, partition: str | None, gpus_per_node: int,
                  time_limit: str | None, account: str | None, qos: str | None,
                  queue_timeout_s: float | None = None) -> SlurmRequest | None:
    """The --slurm flags as one request (None without --slurm, whose flags are then refused)."""
    given = {"--partition": partition, "--time": time_limit, "--account": account,
             "--qos": qos}
    if slurm_site is None:
        if any(given.values()) or gpus_per_node or queue_timeout_s is not None:
            raise UsageError("--partition, --gpus-per-node, --time, --account, --qos, "
                             "--queue-timeout: apply with --slurm")
        return None
    for flag, value in given.items():
        if flag != "--time" and value is not None and not re.fullmatch(SLURM_WORD, value):
            raise UsageError(f"{flag}: {value[:80]!r} is not a Slurm name")
    if time_limit is not None and not re.fullmatch(r"[0-9][0-9:-]{0,15}", time_limit):
        raise UsageError(f"--time: {time_limit[:80]!r}: write it as Slurm does (2:00:00, 1-0)")
    return SlurmRequest(slurm_site, SlurmAsk(partition, gpus_per_node, time_limit, account,
                                             qos), queue_timeout_s)


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
