"""What the nodes this machine runs share, whichever backend made them (local, booted, the Slurm
lab): sshd on loopback (`loopback.py`), network namespaces joined by a bridge (`node_network.py`),
a cgroup per node (`node_cgroup.py`), the tag on every process and a held cluster's limits
(`held_limits.py`)."""
