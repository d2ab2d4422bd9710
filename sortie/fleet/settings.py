"""This controller's settings, `$SORTIE_HOME/config.yaml`: what a user sets once for their
account rather than on every command line. Every field is optional; no file means defaults.

    # Regions this account cannot use (no quota, no contract): "REGION" on any cloud, or
    # "CLOUD:REGION". `sortie plan --gpu` does not list them; `run/up --gpu` never tries them.
    exclude_regions: [eu-central-1, aws:ap-northeast-2]
    # The stack profile each cloud's `--gpu` launch starts from (its sshAllowedCidrs, owner,
    # project, TTL...); the machine, region and node count come from the offer.
    gpu_profiles: {aws: my-aws, gcp: my-gcp}
"""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from sortie.core.errors import UsageError, first_field_error
from sortie.core.userfile import read_yaml
from sortie.infra.clouds import CLOUDS, CloudName

SETTINGS_FILE = "config.yaml"
MAX_SETTINGS_BYTES = 64 << 10
REGION_ENTRY = re.compile(rf"(({'|'.join(CLOUDS)}):)?[a-z][a-z0-9-]{{1,40}}")
PROFILE = re.compile(r"[A-Za-z0-9_.-]{1,100}")


class Settings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    exclude_regions: tuple[str, ...] = ()
    gpu_profiles: dict[CloudName, str] = {}

    @field_validator("exclude_regions")
    @classmethod
    def _regions(cls, regions: tuple[str, ...]) -> tuple[str, ...]:
        for region in regions:
            if not REGION_ENTRY.fullmatch(region):
                raise ValueError(f"{region[:60]!r} is not a region (us-east-1) or "
                                 "cloud:region (aws:us-east-1)")
        return regions

    @field_validator("gpu_profiles")
    @classmethod
    def _profiles(cls, profiles: dict[str, str]) -> dict[str, str]:
        for cloud, name in profiles.items():
            if not PROFILE.fullmatch(name):
                raise ValueError(f"{cloud}: {name[:60]!r} is not a profile name")
        return profiles

    def gpu_profile(self, cloud: str) -> str | None:
        """The profile a `--gpu` launch on ``cloud`` starts from, where the user set one."""
        return next((name for key, name in self.gpu_profiles.items() if key == cloud), None)


def load_settings(home: Path) -> Settings:
    """The settings in ``home``/config.yaml (defaults when there is none); a UsageError naming
    the file and the field when it is wrong."""
    path = home / SETTINGS_FILE
    if not path.is_file():
        return Settings()
    data = read_yaml(path, MAX_SETTINGS_BYTES, "settings file")
    if not isinstance(data, dict):
        raise UsageError(f"{path}: settings are a mapping of fields (exclude_regions, "
                         "gpu_profiles)")
    try:
        return Settings.model_validate(data)
    except ValidationError as exc:
        raise UsageError(f"{path}: {first_field_error(exc)}") from None
