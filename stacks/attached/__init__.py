"""Clusters sortie did not create (`attach --hosts`, `--pulumi-stack`): used and detached,
never destroyed (`attached_backend.py`)."""
