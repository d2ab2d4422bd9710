"""`sortie init DIR --stack PROFILE`: a Pulumi project of the user's own, outside sortie's
checkout, whose `pulumi up` runs the cluster program installed with sortie.

It writes, refusing to replace any file already there:
- ``Pulumi.yaml``: the project (Python runtime, in the environment sortie is installed in; its
  stack config beside it);
- ``__main__.py``: the program's entry point, two lines that run the installed
  `sortie.infra.program`;
- ``Pulumi.<stack>.yaml``: the profile, with `--set` overrides applied;
- ``README.md``: the next commands.
"""

from __future__ import annotations

import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import yaml

from sortie.core.errors import UsageError
from sortie.core.statefile import write_text
from sortie.infra.spec import NAMESPACE
from sortie.stacks.cloud.stack_api import spec_from_config
from sortie.stacks.profiles import PROGRAM_IMPORT, apply_overrides, load_profile, profile_path

ENTRY_POINT = f'''"""The sortie cluster program, installed with sortie: `pulumi up` here runs it."""

{PROGRAM_IMPORT}

main()
'''

NEXT_STEPS = """# {stack}: a sortie cluster as a Pulumi project

Written by `sortie init` from the profile `{profile}`; `pulumi up` here runs the cluster program
installed with sortie ({program}).

```sh
pulumi login --local                       # or your own state backend
pulumi stack init {stack}                  # reads Pulumi.{stack}.yaml
pulumi config set --path 'sortie:sshAllowedCidrs[0]' "$(curl -s https://checkip.amazonaws.com)/32"
# The expiry (sortie:expiresAt, its tags and labels) was pinned when this was written, so that
# every `pulumi up` keeps it; before a later first `up`, set it anew:
#   pulumi config set sortie:expiresAt "$(date -u -d '+{ttl} hours' +%Y-%m-%dT%H:%M:00Z)"
pulumi preview                             # or, from here: sortie plan --stack {profile}
pulumi up
sortie attach {stack} --pulumi-stack {stack}   # run jobs on it; `sortie down` detaches
pulumi destroy
```
"""


def pin_expiry(profile_text: str, config: dict[str, Any], ttl_hours: float,
               now: datetime) -> str:
    """The profile with `sortie:expiresAt` set (now + its TTL): the program otherwise computes
    the expiry anew at every `pulumi up`, and its tags and labels would move each time (GCP's
    boot disks took it as a create-only label: every VM replaced)."""
    expires = (now + timedelta(hours=ttl_hours)).strftime("%Y-%m-%dT%H:%M:00Z")
    pinned = (f"  {NAMESPACE}:expiresAt: '{expires}'  # pinned by `sortie init`: every `pulumi "
              "up` keeps it; set it anew before a later first `up`\n")
    text = profile_text if profile_text.endswith("\n") else profile_text + "\n"
    if (yaml.safe_load(text + pinned) or {}).get("config", {}).get(f"{NAMESPACE}:expiresAt") \
            != expires:  # the profile does not end in its config map: write it whole
        return yaml.safe_dump({"config": {**config, f"{NAMESPACE}:expiresAt": expires}},
                              sort_keys=False)
    return text + pinned


def project_files(stack: str, overrides: tuple[str, ...] = (),
                  now: datetime | None = None) -> dict[str, str]:
    """The files of the project, by name (the profile read and checked first)."""
    config = apply_overrides(load_profile(stack), overrides)
    spec = spec_from_config(stack, config)  # `--set nodes=0` is refused as `plan` refuses it
    source = profile_path(stack)
    # The profile as it is, its comments ("replace it with yours") kept; with --set, as set.
    profile_text = source.read_text() if not overrides and source is not None else \
        f"# From profile {stack}, with --set {' '.join(overrides)}\n" + \
        yaml.safe_dump({"config": config}, sort_keys=False)
    if f"{NAMESPACE}:expiresAt" not in config:
        profile_text = pin_expiry(profile_text, config, spec.ttl_hours,
                                  now or datetime.now(timezone.utc))
    runtime: dict[str, Any] = {"name": "python", "options": {"toolchain": "pip"}}
    if sys.prefix != sys.base_prefix:  # sortie lives in a virtualenv: Pulumi runs that one
        runtime["options"]["virtualenv"] = sys.prefix
    project = {"name": "sortie", "description": f"A sortie GPU cluster from profile {stack}.",
               "runtime": runtime}
    from sortie.infra import program

    return {
        "Pulumi.yaml": yaml.safe_dump(project, sort_keys=False),
        "__main__.py": ENTRY_POINT,
        f"Pulumi.{stack}.yaml": profile_text,
        "README.md": NEXT_STEPS.format(stack=stack, profile=stack, ttl=f"{spec.ttl_hours:g}",
                                       program=Path(program.__file__).parent),
    }


def write_project(directory: Path, stack: str, overrides: tuple[str, ...] = ()) -> list[Path]:
    """Write the project into ``directory`` (made if missing); nothing is written when any of
    its files exists already."""
    files = project_files(stack, overrides)
    if directory.exists() and not directory.is_dir():
        raise UsageError(f"DIR: {directory} is not a directory")
    there = [name for name in files if (directory / name).exists()
             or (directory / name).is_symlink()]
    if there:
        raise UsageError(f"DIR: {directory} already has {', '.join(there)}; nothing was "
                         "written (choose an empty directory)")
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in files.items():
        write_text(directory / name, text, 0o644)
        written.append(directory / name)
    return written
