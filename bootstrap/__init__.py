"""Bootstrap a cluster over SSH with Fabric: wait for nodes, verify them, install the trainer,
launch and watch torchrun, collect artifacts. Consumes an Inventory (`bootstrap/inventory.py`,
the contract every backend fills in) from any backend."""
