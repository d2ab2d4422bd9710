"""What every cloud component hands back: the same output shape, so one inventory builder serves
all clouds (`bootstrap.inventory.inventory_from_outputs`), plus the keys every cluster needs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pulumi
import pulumi_tls as tls

from sortie.infra.cloud_init import PYTHON_LINK, STORE_DRIVERS, render_cloud_init
from sortie.infra.clouds import facts
from sortie.infra.spec import ClusterSpec


def ssh_keys(name: str, nodes: int, parent: pulumi.Resource
             ) -> tuple[tls.PrivateKey, list[tls.PrivateKey]]:
    """The controller's client key and one host key per node, kept as secrets in stack state."""
    child = pulumi.ResourceOptions(parent=parent)
    client = tls.PrivateKey(f"{name}-client-key", algorithm="ED25519", opts=child)
    hosts = [tls.PrivateKey(f"{name}-host-key-{i}", algorithm="ED25519", opts=child)
             for i in range(nodes)]
    return client, hosts


def node_cloud_init(host_key: tls.PrivateKey, fetch_host_key: pulumi.Input[str],
                    spec: ClusterSpec, python_candidates: tuple[str, ...],
                    extra_files: tuple[tuple[str, str], ...] = (),
                    extra_commands: tuple[tuple[str, ...], ...] = (),
                    timer_lag_min: int = 0) -> pulumi.Output[str]:
    """A node's cloud-init: the public half of its own pinned host key and the command that
    fetches the private half, the spec's TTL and idle stop, the Python probe and the cloud's
    bucket driver; see `render_cloud_init`."""
    driver = STORE_DRIVERS[facts(spec.cloud).bucket_scheme]
    return pulumi.Output.all(host_key.public_key_openssh, fetch_host_key).apply(
        lambda v: render_cloud_init(v[0], v[1], spec.ttl_hours, python_candidates, extra_files,
                                    extra_commands, timer_lag_min, spec.idle_stop_minutes,
                                    store_driver=driver))


def node_output(name: str, public_address: pulumi.Input[str],
                private_address: pulumi.Input[str], host_key: tls.PrivateKey,
                spot: bool) -> pulumi.Output[dict[str, Any]]:
    return pulumi.Output.all(public_address, private_address, host_key.public_key_openssh,
                             host_key.public_key_fingerprint_sha256).apply(
        lambda v: {"name": name, "public_address": v[0], "private_address": v[1],
                   "host_key": v[2].strip(), "host_key_fingerprint": v[3], "spot": spot})


def cluster_outputs(spec: ClusterSpec, nodes: list[pulumi.Output[dict[str, Any]]], *,
                    ssh_user: str, workdir: str, bucket_url: pulumi.Input[str],
                    client_key: tls.PrivateKey, zone: pulumi.Input[str] | None = None,
                    train_env: Mapping[str, pulumi.Input[str]] | None = None) -> dict[str, Any]:
    """The stack outputs, identical in shape on every cloud (`zone`: where the cloud program
    placed the nodes, when the spec left it open; `train_env`: what the trainer processes need
    besides, e.g. how to sign in to the bucket)."""
    return {
        "cluster": spec.cluster,
        "cloud": spec.cloud,
        "region": spec.region,
        "zone": zone or spec.zone,
        "instance_type": spec.instance_type,
        "gpus_per_node": spec.instance.gpus,
        "ssh_user": ssh_user,
        "workdir": workdir,
        "python": PYTHON_LINK,  # probed at boot (`infra/cloud_init.py`)
        "nodes": pulumi.Output.all(*nodes),
        "bucket_url": bucket_url,
        "expires_at": spec.expires_tag,
        "client_private_key": pulumi.Output.secret(client_key.private_key_openssh),
        **({"train_env": pulumi.Output.from_input(train_env)} if train_env else {}),
    }
