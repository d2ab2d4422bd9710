"""Booted nodes: a Debian image (`image.py`) booted with `systemd-nspawn --boot` (`node.py`,
`nodes.py`), reached through a relay into its namespace (`relay.py`), running the Pulumi
programs' own cloud-init beside stand-ins for a cloud's metadata and secret store
(`standins.py`): the rehearsal of a cloud launch (`cloud_rehearsal.py`)."""
