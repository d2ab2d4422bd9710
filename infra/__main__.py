"""Pulumi entry point (`main: infra/` in Pulumi.yaml): validate the spec, declare the cluster.

A bad profile stops here with one line naming the key, before any resource is declared.
"""

import sys
from pathlib import Path

# Pulumi runs this file with infra/ on sys.path; the checkout's root makes `sortie` (and through
# its link, `sortie.infra`) importable even in a virtualenv where sortie itself is not installed.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sortie.infra.program import main  # noqa: E402

main()
