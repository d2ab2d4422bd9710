"""What every node is told about its place in the cluster: the environment of a job's `setup`
and `run`, and of the processes `--script` starts (docs/your-job.md, "Your job's environment").

Node ranks follow the inventory's order: rank 0 is the head, which hosts the rendezvous store.
"""

from __future__ import annotations

from sortie.bootstrap.node_layout import trainer_home
from sortie.core.inventory import Inventory, Node


def torchrun_path(node: Node) -> str:
    """`trainer/torchrun.py` as installed on ``node`` (with the trainer): torchrun, except that
    a rank's exit code 75 (preempted) is its own exit code too."""
    return f"{trainer_home(node)}/trainer/torchrun.py"


def cluster_environment(inventory: Inventory, node: Node) -> dict[str, str]:
    """The cluster's variables on ``node`` (the inventory's), with the interface gloo and NCCL
    bind to where the node names its own: the same on every node would not hold where names
    differ (gloo then binds 127.0.0.1, and training fails after a health check that passed)."""
    own = {name: node.interface for name in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
           if node.interface and name not in inventory.train_env}  # (the cluster's own: kept)
    return {**inventory.train_env, **own}


def interfaces_kept(inventory: Inventory, before: Inventory) -> Inventory:
    """``inventory`` (a backend's, after a node was replaced) with the interfaces found
    ``before`` on the nodes that did not change."""
    kept = {node.name: node for node in before.nodes}

    def unchanged(node: Node) -> bool:
        old = kept.get(node.name)
        return old is not None and node.interface is None and \
            old.model_copy(update={"interface": None}) == node

    return inventory.model_copy(update={"nodes": [kept[node.name] if unchanged(node) else node
                                                  for node in inventory.nodes]})


def place_environment(inventory: Inventory, node: Node, *, workdir: str,
                      python: str) -> dict[str, str]:
    """What holds for any job on ``node`` (an `ssh` session's too): the SORTIE_* variables of
    its place in the cluster, the plain MASTER_ADDR, MASTER_PORT and NODE_RANK that scripts
    commonly read, the job's directory and ``python``, the job's (`bootstrap/job_env.py`)."""
    rank = inventory.node_rank(node.name)
    master, port = inventory.head.private_address, str(inventory.rdzv_port)
    # A place every node (and a replacement) reaches; a cluster attached from a hosts file has
    # none, and the variable is then left unset rather than empty.
    checkpoints = inventory.train_env.get("SORTIE_CHECKPOINT_URL")
    return {
        "SORTIE_NODE_RANK": str(rank),
        "SORTIE_NUM_NODES": str(len(inventory.nodes)),
        "SORTIE_NODE_IPS": "\n".join(n.private_address for n in inventory.nodes),
        "SORTIE_MASTER_ADDR": master,
        "SORTIE_MASTER_PORT": port,
        "SORTIE_GPUS_PER_NODE": str(node.gpus),
        "SORTIE_WORKDIR": workdir,
        **({"SORTIE_CHECKPOINT_URL": checkpoints} if checkpoints else {}),
        "SORTIE_PYTHON": python,  # the job's Python with torch (`$SORTIE_PYTHON -m pip`)
        # torchrun, except that a rank's preemption exit (75) is its exit too (trainer/torchrun.py)
        "SORTIE_TORCHRUN": f"{python} {torchrun_path(node)}",
        "MASTER_ADDR": master,
        "MASTER_PORT": port,
        "NODE_RANK": str(rank),
    }


def node_environment(inventory: Inventory, node: Node, *, run_id: str, procs_per_node: int,
                     workdir: str, artifact_dir: str, python: str) -> dict[str, str]:
    """The variables of one run's job on ``node``: its place (`place_environment`) and the
    run's own."""
    return {**place_environment(inventory, node, workdir=workdir, python=python),
            "SORTIE_PROCS_PER_NODE": str(procs_per_node),
            "SORTIE_RUN_ID": run_id,  # the same across recoveries
            "SORTIE_ARTIFACT_DIR": artifact_dir}
