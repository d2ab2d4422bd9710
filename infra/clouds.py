"""The clouds sortie runs on, by name. Each has a folder, `infra/<cloud>/`: its program
(`program.py`), how its resources read to a reviewer (`review.py`), what it is to sortie
(`facts.py`: machines, quotas, rules, idle cost) and what the controller asks of it (`home.py`:
credentials, zones, the teardown sweep; loaded by `cloud_home.home`). Adding a cloud: its
folder, and its name here."""

from __future__ import annotations

import importlib
from typing import Literal, get_args

from sortie.infra.cloud_facts import CloudFacts

CloudName = Literal["aws", "gcp", "azure"]
CLOUDS: tuple[str, ...] = get_args(CloudName)


def facts(cloud: str) -> CloudFacts:
    """The facts of one cloud (imported on first use; they import no cloud SDK)."""
    return importlib.import_module(f".{cloud}.facts", __package__).FACTS

