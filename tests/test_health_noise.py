"""The health gate never names a healthy node on a busy machine: a relative rule over noisy
measurements (best of several round trips, a margin of half the median, a second measurement
before a node is named), checked many times beside CPU burners."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bootstrap.health import check_health
from bootstrap.prepare import prepare
from stacks.local import LocalBackend
from tests.helpers import needs_sshd

pytestmark = [pytest.mark.e2e, needs_sshd]
CHECKS = 20


def test_no_healthy_node_is_named_over_many_checks_on_a_loaded_machine(sortie_home: Path):
    backend = LocalBackend(sortie_home)
    inventory = backend.up("noisy", 4)
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        with prepare(inventory) as conns:
            named = [check_health(conns, inventory, "quick").bad for _ in range(CHECKS)]
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
    assert [bad for bad in named if bad] == [], "a healthy node was named"
