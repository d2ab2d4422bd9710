"""Stack profiles: `stacks/profiles/Pulumi.<name>.yaml`, the files `pulumi up` reads (Pulumi.yaml's
stackConfigDir), beside the code that reads them for `sortie run --stack` and `sortie plan`.
They ship in the package; a user's own profiles (`$SORTIE_PROFILES` or `sortie --profiles DIR`,
directories separated like PATH) are found first, so one of the same name replaces a shipped one."""

from __future__ import annotations

import datetime
import os
import re
from pathlib import Path
from typing import Any

from sortie.core.errors import UsageError
from sortie.core.naming import PROFILES_ENV
from sortie.core.userfile import parse_yaml, read_yaml
from sortie.infra.spec import NAMESPACE

PROFILES_DIR = Path(__file__).resolve().parent
MAX_PROFILE_BYTES = 1 << 20
PROFILE_NAME = re.compile(r"[A-Za-z0-9_.-]+")
# The line a `sortie init` project's entry point runs the cluster program with: how such a
# project is known.
PROGRAM_IMPORT = "from sortie.infra.program import main"


def profile_dirs() -> list[Path]:
    """Where profiles are looked for, in order: the user's directories, then the shipped ones."""
    users = [Path(part).expanduser() for part in os.environ.get(PROFILES_ENV, "").split(
        os.pathsep) if part]
    for directory in users:
        if not directory.is_dir():  # a FIFO, /dev/zero, a file: nothing to look in
            raise UsageError(f"{PROFILES_ENV}: {str(directory)[:200]!r} is not a directory")
    return [*users, *_init_project(), PROFILES_DIR]


def _init_project() -> list[Path]:
    """The current directory when it is a project `sortie init` wrote: its own (edited)
    profile is the one `sortie plan --stack NAME` means there, not the shipped one."""
    here = Path.cwd()
    try:
        entry = (here / "__main__.py").read_text(errors="replace")[:4096] \
            if (here / "Pulumi.yaml").is_file() and (here / "__main__.py").is_file() else ""
    except OSError:
        return []
    return [here] if PROGRAM_IMPORT in entry else []


def _dirs(directory: Path | None) -> list[Path]:
    return [directory] if directory is not None else profile_dirs()


def profile_path(name: str, directory: Path | None = None) -> Path | None:
    """The file of profile ``name``: the first directory that has it; None when none does."""
    if not PROFILE_NAME.fullmatch(name):
        return None
    return next((path for d in _dirs(directory)
                 if (path := d / f"Pulumi.{name}.yaml").is_file()), None)


def profile_names(directory: Path | None = None) -> list[str]:
    found = {p.name.removeprefix("Pulumi.").removesuffix(".yaml")
             for d in _dirs(directory) for p in d.glob("Pulumi.*.yaml")
             if p.is_file()}  # as `profile_path` finds them: never a FIFO or a device
    return sorted(name for name in found if PROFILE_NAME.fullmatch(name))


def load_profile(name: str, directory: Path | None = None) -> dict[str, Any]:
    """The profile's config as full keys ("sortie:nodes") to typed values."""
    path = profile_path(name, directory)
    if path is None:
        where = " and ".join(str(d) for d in _dirs(directory))
        raise UsageError(f"--stack: no profile {name!r} in {where}; profiles: "
                         f"{', '.join(profile_names(directory)) or 'none'}")
    document = read_yaml(path, MAX_PROFILE_BYTES, "stack profile")
    config = document.get("config", {}) if isinstance(document, dict) else None
    if not isinstance(config, dict):
        raise UsageError(f"{path}: `config` must be a mapping of keys to values")
    for key in config:
        _check_key(key, str(path))
    return {key: _config_value(value) for key, value in config.items()}


def _config_value(value: Any) -> Any:
    """YAML reads 2026-12-01 as a date; Pulumi config holds text, numbers, lists and maps."""
    return value.isoformat() if isinstance(value, datetime.date) else value


def _check_key(key: object, where: str) -> None:
    """Only `sortie:` settings reach the program: it configures each cloud's provider itself
    (from sortie:region, sortie:project), so an `aws:region` would be silently ignored."""
    if not isinstance(key, str) or not key.startswith(f"{NAMESPACE}:"):
        raise UsageError(f"{where}: {key!r} is not a sortie setting; the program sets the "
                         f"cloud's provider from {NAMESPACE}: keys (e.g. region=eu-west-1)")


def apply_overrides(config: dict[str, Any], assignments: tuple[str, ...]) -> dict[str, Any]:
    """`--set key=value` on top of a profile; a key without a namespace is a sortie: key."""
    merged = dict(config)
    for assignment in assignments:
        key, sep, value = assignment.partition("=")
        if not sep or not key:
            raise UsageError(f"--set: {assignment!r} is not KEY=VALUE (e.g. nodes=16)")
        key = key if ":" in key else f"{NAMESPACE}:{key}"
        _check_key(key, f"--set {assignment}")
        merged[key] = _config_value(parse_yaml(value, f"--set {key.removeprefix(NAMESPACE + ':')}",
                                               "value"))
        if key == f"{NAMESPACE}:expiresAt":
            _not_past(merged[key])
    return merged


def _not_past(value: Any) -> None:
    """`--set expiresAt` in the past: every node would power itself off as it boots. (A
    launched stack's own expiresAt passes with its TTL: only what the user sets is checked.)"""
    try:
        when = datetime.datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return  # not a time: the spec names the field
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.timezone.utc)
    if when <= datetime.datetime.now(datetime.timezone.utc):
        raise UsageError(f"--set expiresAt: {value} is past: the nodes would power off as "
                         "they boot (leave it unset: the TTL sets it)")
