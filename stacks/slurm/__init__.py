"""Slurm: a sortie is an allocation on a cluster an ops team runs (`slurm_backend.py`), asked
through Slurm's own commands (`slurm_queue.py`), its nodes' interfaces and free ports
(`slurm_network.py`), the clusters attached and their prices
(`slurm_sites.py`), as `status` lists them and `down` detaches one (`site_listing.py`), and a
real Slurm in namespaces for tests, benchmarks and `sortie slurm-lab` (`slurm_lab.py`, its users'
view of this machine's files in `lab_view.py`). The batch job that holds a sortie's nodes, and
ends itself when its controller stopped waiting, is `hold_script.py`; an allocation as `status`
lists it, `allocation_row.py`; a run handed to Slurm whole (`run --detach`), `detached_run.py`,
its controller's backend inside the allocation, `in_allocation.py`. Its nodes are reached
through `srun` steps (`bootstrap/srun.py`, a node transport)."""
