"""The clouds sortie runs on, by name. Each has a folder, `infra/<cloud>/`: its program
(`program.py`), how its resources read to a reviewer (`review.py`), what it is to sortie
(`facts.py`: machines, quotas, rules, idle cost) and what the controller asks of it (`home.py`:
credentials, zones, the teardown sweep; loaded by `cloud_home.home`). Adding a cloud: its
folder, and its name here."""

from __future__ import annotations

import importlib
import importlib.util
from typing import Literal, get_args

from sortie.core.errors import UsageError
from sortie.infra.cloud_facts import CloudFacts

CloudName = Literal["aws", "gcp", "azure"]
CLOUDS: tuple[str, ...] = get_args(CloudName)


def facts(cloud: str) -> CloudFacts:
    """The facts of one cloud (imported on first use; they import no cloud SDK)."""
    return importlib.import_module(f".{cloud}.facts", __package__).FACTS



class SdkMissing(UsageError):
    """A cloud's SDK is not installed: the message says which extra installs it."""


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError, AttributeError):  # a parent absent, or stopped on purpose
        return False


def missing_sdk(cloud: str) -> str | None:
    """One line saying which extra installs ``cloud``'s SDK, if any of it is missing."""
    missing = [module for module in facts(cloud).sdk if not _installed(module)]
    if not missing:
        return None
    return (f"the {cloud} cloud needs its SDK ({', '.join(missing)} not installed): "
            f"pip install 'sortie[{cloud}]'")


def require_sdk(cloud: str) -> None:
    """Raise `SdkMissing` (`missing_sdk`'s line) unless ``cloud``'s SDK is here. Asked before a
    command that needs the cloud starts, and where its modules are loaded."""
    if (missing := missing_sdk(cloud)) is not None:
        raise SdkMissing(missing)
