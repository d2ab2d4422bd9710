"""Stack profiles: `stacks/Pulumi.<name>.yaml`, the files `pulumi up` reads (stackConfigDir)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from stacks.errors import UsageError

PROFILES_DIR = Path(__file__).resolve().parent


def profile_names(directory: Path = PROFILES_DIR) -> list[str]:
    return sorted(p.name[len("Pulumi."):-len(".yaml")] for p in directory.glob("Pulumi.*.yaml"))


def load_profile(name: str, directory: Path = PROFILES_DIR) -> dict[str, Any]:
    """The profile's config as full keys ("sortie:nodes") to typed values."""
    path = directory / f"Pulumi.{name}.yaml"
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name) or not path.is_file():
        raise UsageError(f"--stack: no profile {name!r} in {directory}; profiles: "
                         f"{', '.join(profile_names(directory)) or 'none'}")
    try:
        document = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise UsageError(f"{path}: not valid YAML ({' '.join(str(exc).split())})") from None
    config = document.get("config", {}) if isinstance(document, dict) else None
    if not isinstance(config, dict):
        raise UsageError(f"{path}: `config` must be a mapping of keys to values")
    return config


def apply_overrides(config: dict[str, Any], assignments: tuple[str, ...]) -> dict[str, Any]:
    """`--set key=value` on top of a profile; a key without a namespace is a sortie: key."""
    merged = dict(config)
    for assignment in assignments:
        key, sep, value = assignment.partition("=")
        if not sep or not key:
            raise UsageError(f"--set: {assignment!r} is not KEY=VALUE (e.g. nodes=16)")
        merged[key if ":" in key else f"sortie:{key}"] = yaml.safe_load(value)
    return merged
