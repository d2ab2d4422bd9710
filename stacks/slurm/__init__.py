"""Slurm: a sortie is an allocation on a cluster an ops team runs (`slurm_backend.py`), asked
through Slurm's own commands (`slurm_queue.py`), the clusters attached and their prices
(`slurm_sites.py`), and a real Slurm in namespaces for tests and benchmarks (`slurm_lab.py`). Its
nodes are reached through `srun` steps (`bootstrap/srun.py`, a node transport)."""
