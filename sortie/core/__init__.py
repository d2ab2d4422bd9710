"""The shared kernel: what every layer below the command line uses — errors, state files,
files users hand us, sizes, the inventory of a cluster's nodes, sortie names, and where this
controller keeps its state. It imports nothing of ours outside itself."""
