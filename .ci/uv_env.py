"""Print this machine's pip settings as uv's environment, for `eval` in the Makefile.

uv reads no pip.conf, and pip's settings are what make `torch==2.13.0` the local CPU build
(find-links, constraints) and reach the extra package indexes. Each set value becomes
`export UV_...='...'`; pip's environment variables (PIP_*) count too, as pip reads them.
"""

from __future__ import annotations

import shlex
import subprocess
import sys

# pip's name -> uv's variable.
SETTINGS = {"index-url": "UV_INDEX_URL", "extra-index-url": "UV_EXTRA_INDEX_URL",
            "find-links": "UV_FIND_LINKS", "constraint": "UV_CONSTRAINT"}


def pip_settings() -> dict[str, str]:
    """`pip config list`: lines like `global.find-links='/opt/wheels'` (`:env:.` for PIP_*);
    a later line (a more specific file, or the environment) wins, as in pip."""
    listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"],
                            capture_output=True, text=True, timeout=60).stdout
    found: dict[str, str] = {}
    for line in listed.splitlines():
        key, _, value = line.partition("=")
        section, _, name = key.rpartition(".")
        if section in ("global", "install", ":env:") and name in SETTINGS:
            found[name] = value.strip().strip("'\"")
    return found


if __name__ == "__main__":
    # Every index is one pip trusts alike: the best version wins wherever it is (the local
    # torch 2.13.0+cpu over the index's 2.13.0, which pulls CUDA).
    print("export UV_INDEX_STRATEGY=unsafe-best-match")
    for name, value in pip_settings().items():
        print(f"export {SETTINGS[name]}={shlex.quote(value)}")
