"""The subtrees of a cluster component: every cloud's cluster is built of the same parts, each a
child component whose resources are its children. Teardown and replacement address a part by its
component (`stacks/pulumi_backend.py`): "keep the bucket" keeps the Bucket subtree, "replace
node-1" replaces the machine under node-1's Node component, whatever the resources are called.

- Network: the private network, its subnet and its firewall rules.
- Bucket: the results bucket and its settings (absent when the profile names an existing one).
- NodeAccess: the nodes' cloud identity and its grant on the bucket; it goes with the nodes.
- Node (one per node, named ``<cluster>-<node>``): the machine and what is its alone.
What the whole cluster shares (provider, keys, placement, launch template, Azure's resource group)
stays directly under the cluster component.
"""

from __future__ import annotations

from typing import Any, Literal

import pulumi

PartKind = Literal["Network", "Bucket", "NodeAccess", "Node"]
NETWORK: PartKind = "Network"
BUCKET: PartKind = "Bucket"
NODE_ACCESS: PartKind = "NodeAccess"
NODE: PartKind = "Node"


def part_type(cloud: str, kind: PartKind) -> str:
    """The Pulumi type of a part's component, e.g. "sortie:aws:Node"."""
    return f"sortie:{cloud}:{kind}"


def node_part_name(cluster_name: str, node_name: str) -> str:
    """A Node component's name: the cluster's, then the node's as the inventory calls it."""
    return f"{cluster_name}-{node_name}"


class Part(pulumi.ComponentResource):
    """One subtree of a cluster. Declare its resources with ``opts=part.child``, then ``done``."""

    def __init__(self, cluster: pulumi.ComponentResource, cloud: str, kind: PartKind,
                 name: str, provider: pulumi.ProviderResource | None = None) -> None:
        super().__init__(part_type(cloud, kind), name, None,
                         pulumi.ResourceOptions(parent=cluster))
        self.child = pulumi.ResourceOptions(parent=self, provider=provider)

    def done(self, outputs: dict[str, Any]) -> None:
        """Register what the part hands back (shown in the stack's state)."""
        self.register_outputs(outputs)
