"""Pulumi entry point (`main: infra/` in Pulumi.yaml): validate the spec, declare the cluster.

A bad profile stops here with one line naming the key, before any resource is declared.
"""

import sys
from pathlib import Path

import pulumi

# Pulumi runs this file with infra/ on sys.path; the project root makes `infra` importable even
# in a virtualenv where sortie itself is not installed.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from infra.program import declare_cluster  # noqa: E402
from infra.spec import SpecError, spec_from_pulumi_config  # noqa: E402

try:
    declare_cluster(spec_from_pulumi_config())
except SpecError as exc:
    raise pulumi.RunError(str(exc)) from None
