"""Stack profiles and the lifecycle of a sortie: up, bootstrap, run, collect, down."""
