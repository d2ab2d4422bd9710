"""Bootstrap a cluster over SSH with Fabric: wait for nodes, verify them, install the trainer,
launch and watch torchrun, collect artifacts. Consumes an Inventory from any backend."""
