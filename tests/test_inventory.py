"""The inventory: one typed structure that every backend returns and bootstrap consumes."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from sortie.core.inventory import Inventory, Node

pytestmark = pytest.mark.unit


def make_node(index: int, port: int = 2200) -> Node:
    return Node(name=f"node-{index}", address=f"10.0.0.{index + 1}", port=port, user="ubuntu",
                key_path=Path("/keys/client"), host_key="ssh-ed25519 AAAAC3Nza", gpus=8,
                private_address=f"172.31.0.{index + 1}", workdir="/home/ubuntu/sortie")


def test_round_trip_and_head(tmp_path: Path):
    inventory = Inventory(cluster_id="c1", backend="aws", nodes=[make_node(0), make_node(1)])
    inventory.save(tmp_path / "inv.json")
    loaded = Inventory.load(tmp_path / "inv.json")
    assert loaded == inventory
    assert loaded.head.name == "node-0"
    assert loaded.node("node-1").private_address == "172.31.0.2"


def test_known_hosts_uses_bracketed_names_for_non_default_ports():
    inventory = Inventory(cluster_id="c1", backend="aws",
                          nodes=[make_node(0, port=22), make_node(1, port=2222)])
    assert inventory.known_hosts() == ("10.0.0.1 ssh-ed25519 AAAAC3Nza\n"
                                       "[10.0.0.2]:2222 ssh-ed25519 AAAAC3Nza\n")


def test_unknown_node_names_the_choices():
    inventory = Inventory(cluster_id="c1", backend="aws", nodes=[make_node(0)])
    with pytest.raises(KeyError, match="node-0"):
        inventory.node("node-7")


@pytest.mark.parametrize("bad", [{"nodes": []}, {"rdzv_port": 0}])
def test_invalid_inventory_is_rejected(bad):
    fields = {"cluster_id": "c1", "backend": "aws", "nodes": [make_node(0)], **bad}
    with pytest.raises(ValidationError):
        Inventory(**fields)


def test_negative_gpus_rejected():
    with pytest.raises(ValidationError, match="gpus"):
        Node.model_validate({**make_node(0).model_dump(), "gpus": -1})
