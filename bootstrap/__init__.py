"""Bootstrap a cluster over SSH with Fabric: wait for nodes, verify them, install the trainer,
sync code, run setup, launch and watch torchrun, collect artifacts. Consumes an Inventory
(`sortie/core/inventory.py`, the contract every backend fills in) from any backend."""
