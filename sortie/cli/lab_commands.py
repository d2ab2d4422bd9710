"""`sortie slurm-lab up|down`: a real Slurm on this machine to try the Slurm backend on (root)."""

from __future__ import annotations

import click

from sortie.cli import options, render
from sortie.core.home import sortie_home


@click.group(name="slurm-lab")
def slurm_lab() -> None:
    """A real Slurm on this machine, to try `--slurm` without a cluster (root; Debian's
    slurm-wlm, slurmdbd, mariadb-server, munge): the one sortie's own tests run on, with its
    login node reached over SSH on loopback, attached as a Slurm cluster (docs/slurm.md)."""


@slurm_lab.command(name="up")
@click.option("--nodes", type=click.IntRange(1, 8), default=2, show_default=True,
              help="Compute nodes (each a slurmd in a network namespace of its own).")
@click.option("--name", default="lab", show_default=True,
              help="The name it is attached as (`sortie run --slurm NAME`).")
@options.as_json
def up(nodes: int, name: str, as_json: bool) -> None:
    """Start the lab and attach it as NAME; prints the commands that follow."""
    from sortie.fleet.slurm_lab_home import lab_up

    progress, out = render.consoles(as_json)
    with progress.status(f"starting a Slurm lab of {nodes} nodes (munged, MariaDB, slurmdbd, "
                         "slurmctld, slurmd)"):
        lab = lab_up(sortie_home(), name, nodes)
    if as_json:
        render.print_json(out, lab)
        return
    out.print(f"Slurm lab up: {nodes} nodes, partition debug, attached as {lab.name} through "
              f"{lab.login} (its host key pinned); sorties work in {lab.shared_dir}\n"
              f"  sortie run --slurm {lab.name} --nodes {nodes}          the bundled trainer\n"
              f"  sortie up --slurm {lab.name} --nodes {nodes} --name dev   hold an allocation; "
              "then `sortie exec dev ...`\n"
              "  sortie slurm-lab down                   stop it (after `sortie down` of its "
              "sorties)", soft_wrap=True, markup=False)


@slurm_lab.command(name="down")
def down() -> None:
    """Detach the lab's cluster, stop its daemons and remove it (refused while a sortie
    allocates on it: `sortie down NAME` that first)."""
    from sortie.fleet.slurm_lab_home import lab_down

    click.echo(lab_down(sortie_home()))
