"""The health gate never names a healthy node on a busy machine: a relative rule over noisy
measurements (best of several round trips, a margin of half the median, a second measurement
before a node is named), checked many times on a busy machine."""

from __future__ import annotations

from pathlib import Path

import pytest

from sortie.bootstrap.health import check_health
from sortie.bootstrap.prepare import prepare
from sortie.stacks.local.local_backend import LocalBackend
from tests.helpers import busy_machine, needs_sshd

pytestmark = [pytest.mark.e2e, needs_sshd]
CHECKS = 20


def test_no_healthy_node_is_named_over_many_checks_on_a_loaded_machine(sortie_home: Path):
    backend = LocalBackend(sortie_home)
    inventory = backend.up("noisy", 4)
    with busy_machine(burners=2), prepare(inventory) as conns:
        named = [check_health(conns, inventory, "quick").bad for _ in range(CHECKS)]
    assert [bad for bad in named if bad] == [], "a healthy node was named"


def test_the_full_check_times_the_collective_and_every_link_both_ways(
        sortie_home: Path, monkeypatch: pytest.MonkeyPatch):
    """`--health full`: an all-reduce with the job's backend (gloo here) for the bus
    bandwidth, then each link of the ring each way on its own (smaller messages here: the
    sizes are the gate's setting, not what is tested; `quick`'s, not 1 MiB × 2, which a
    loaded machine's scheduler could slow by half, as it did once in CI)."""
    from sortie.bootstrap import health

    monkeypatch.setitem(health.NET_SIZES, "full", health.NET_SIZES["quick"])
    backend = LocalBackend(sortie_home)
    inventory = backend.up("full", 3)
    with prepare(inventory) as conns:
        report = check_health(conns, inventory, "full")
    assert report.ok, report.summary()
    assert report.backend == "gloo" and report.busbw_gbs and report.busbw_gbs > 0
    assert sorted((link.a, link.b) for link in report.links) == sorted(
        (f"node-{a}", f"node-{b}") for a in range(3) for b in range(3) if a != b)
    assert all(row.send_gbs and row.recv_gbs for row in report.nodes)
