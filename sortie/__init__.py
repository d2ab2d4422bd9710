"""sortie's command line (`sortie/cli.py`) and the lifecycle of a sortie (`sortie/lifecycle.py`):
up -> bootstrap -> train -> collect -> down, tying the backends (`stacks/`) to bootstrap."""
