"""What a new cluster's launch flags ask, as one value: `sortie run` and `sortie up` take it from
their flags (`cli/options.launch`; a task file may fill some in), the launch plan reads it. Light
on purpose: every command's options import it, and none of the backends it may choose."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from sortie.infra.offers import GpuAsk

if TYPE_CHECKING:  # Slurm's site models load only with --slurm
    from sortie.stacks.slurm.slurm_sites import SlurmRequest


@dataclass(frozen=True)
class LaunchAsk:
    """Where a new cluster goes and its size: a stack profile's cloud (``stack``, with its
    ``overrides``; ``rehearse``: its nodes booted here), the cheapest place for ``gpu``, an
    allocation on a Slurm cluster (``slurm``), else local nodes; ``nodes`` (None: where it goes
    says), its ``name``, and the cloud state backend (``backend_url``)."""

    stack: str | None = None
    overrides: tuple[str, ...] = ()
    backend_url: str | None = None
    name: str | None = None
    gpu: GpuAsk | None = None
    nodes: int | None = None
    rehearse: bool = False
    slurm: SlurmRequest | None = None
