"""Pulumi entry point (``main: infra/`` in Pulumi.yaml).

A stub for now: it reads the project's shared settings and stops with a clear message, because
the cloud components (AWS, GCP, Azure) are not written yet. Local sorties need no Pulumi program.
"""

import pulumi

config = pulumi.Config()
cloud = config.require("cloud")
raise pulumi.RunError(
    f"sortie: the {cloud!r} cluster program is not implemented yet; "
    "use `sortie run --cloud local` for a local sortie"
)
