"""Stack profiles: `stacks/profiles/Pulumi.<name>.yaml`, the files `pulumi up` reads (Pulumi.yaml's
stackConfigDir), beside the code that reads them for `sortie run --stack` and `sortie plan`."""

from __future__ import annotations

import datetime
import re
from pathlib import Path
from typing import Any

from bootstrap.errors import UsageError
from bootstrap.userfile import parse_yaml, read_yaml
from infra.spec import NAMESPACE

PROFILES_DIR = Path(__file__).resolve().parent
MAX_PROFILE_BYTES = 1 << 20


def profile_names(directory: Path = PROFILES_DIR) -> list[str]:
    return sorted(p.name[len("Pulumi."):-len(".yaml")] for p in directory.glob("Pulumi.*.yaml"))


def load_profile(name: str, directory: Path = PROFILES_DIR) -> dict[str, Any]:
    """The profile's config as full keys ("sortie:nodes") to typed values."""
    path = directory / f"Pulumi.{name}.yaml"
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name) or not path.is_file():
        raise UsageError(f"--stack: no profile {name!r} in {directory}; profiles: "
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
    return merged
