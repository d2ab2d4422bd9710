"""What the nodes this machine runs share, whichever backend made them (local, booted, the Slurm
lab): sshd on loopback (`loopback.py`), network namespaces joined by a bridge (`node_network.py`),
a cgroup per node (`node_cgroup.py`), the tag on every process and a held cluster's limits
(`held_limits.py`), and what a job in an image left on them (`node_images.py`); a registry and
a job's image for the tests and benchmarks of jobs in images (`image_lab.py`)."""
