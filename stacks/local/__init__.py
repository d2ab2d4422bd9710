"""The local backend (`local_backend.py`): every node an OpenSSH sshd of this machine, on loopback
or (root) in a network namespace of its own; booted nodes (`stacks/booted/`) are its third mode.
With its watchdog (`idle_stop.py`), its processes (`processes.py`), a cluster's `status` row
(`local_status.py`) and what it takes from the
environment to rehearse a cloud's capacity and prices (`local_rehearsal.py`)."""
