"""sortie: the command line (`sortie/cli/`), the run engine that drives a sortie up -> bootstrap
-> train -> collect -> down (`sortie/engine/`), every sortie this controller knows and the
backend of each (`sortie/fleet/`), a run's directory and report (`sortie/rundir/`), and the
shared kernel every layer uses (`sortie/core/`)."""
