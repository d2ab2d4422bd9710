"""The subtrees of a cluster component: every cloud's cluster is built of the same parts, each a
child component whose resources are its children. Teardown and replacement address a part by its
component (`stacks/cloud/pulumi_backend.py`, `stacks/cloud/teardown.py`): "keep the bucket"
keeps the Bucket subtree, "replace node-1" replaces the machine under node-1's Node component,
whatever the resources are called.

- Network: the private network, its subnet and its firewall rules.
- Bucket: the results bucket and its settings (absent when the profile names an existing one).
- NodeAccess: the nodes' cloud identities and their grants on the bucket (Azure: and the Key
  Vault of the host keys); it goes with the nodes.
- Node (one per node, named ``<cluster>-<node>``): the machine and what is its alone (its
  host-key secret and the grant on it among them).
What the whole cluster shares (provider, keys, placement, launch template, Azure's resource group)
stays directly under the cluster component.
"""

from __future__ import annotations

from typing import Any

import pulumi

# The parts' names live with the spec: the controller reads them without importing Pulumi.
from sortie.infra.spec import (  # noqa: F401 - re-exported for the cloud programs
    BUCKET,
    NETWORK,
    NODE,
    NODE_ACCESS,
    PartKind,
    node_part_name,
    part_type,
)


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
