"""`GcpGpuCluster`: a GCP A2 or A3 cluster, its networks, bucket and access, as one component with
the subtrees of `infra/parts.py` (Network, Bucket, NodeAccess, one Node per node).

The same bar as AWS, in GCP terms (asserted by tests/test_gcp_program.py):
- firewall: SSH only from `sshAllowedCidrs` to the cluster's nodes, everything among nodes (by
  network tag), nothing else inbound (a custom-mode network has no default rules);
- each node has a service account of its own, holding object access on this cluster's bucket and
  read access to that node's host key (a Secret Manager secret) and nothing else; no private key
  is in the metadata;
- the bucket has uniform access, public access prevention enforced, versioning and expiry;
- spot nodes use exactly the scheduling GCP requires; `max_run_duration` is the TTL on every
  node.
"""

from __future__ import annotations

import ipaddress
import re
import shlex
from pathlib import Path
from typing import Any

import pulumi
import pulumi_gcp as gcp
import pulumi_tls as tls

from sortie.infra.gcp.facts import node_account_id
from sortie.infra.outputs import cluster_outputs, node_cloud_init, node_output, ssh_keys
from sortie.infra.parts import BUCKET, NETWORK, NODE, NODE_ACCESS, Part, PartKind, node_part_name
from sortie.infra.spec import TAG_EXPIRES, ClusterSpec

GCP_VPC_MTU = 8896  # the largest a VPC network takes
# A3's GPU NICs: each in a VPC network of its own, MTU 8244, as Google's GPUDirect guide makes
# them ("Create an A3 Mega, A3 High, or A3 Edge instance with GPUDirect enabled").
GPU_NIC_MTU = 8244
GPU_NIC_CIDR = "10.43.{index}.0/24"
GPU_NIC_RANGE = "10.43.0.0/16"  # every GPU NIC subnet of a cluster
SSH_USER = "sortie"  # created by the guest agent from the `ssh-keys` metadata
SECRET_ACCESSOR = "roles/secretmanager.secretAccessor"
# Where the Deep Learning VM's PyTorch may be (probed at boot, in this order): its families
# have kept it in /opt/conda, then in a venv under /opt (the name changing with the family),
# with Ubuntu 24.04's python3.12 last.
PYTHONS = ("/opt/conda/bin/python3", "/opt/python/bin/python3", "/opt/*/bin/python3",
           "/usr/bin/python3", "/usr/bin/python3.12")
# What fetches the node's host key at boot (its source is written to the node as it is).
HOST_KEY_FETCHER = ("/opt/sortie/gcp_host_key.py",
                    Path(__file__).with_name("host_key.py").read_text())
# The in-guest TTL timer only *stops* a GCP VM, and a stop clears `max_run_duration`'s deadline:
# fired first, it would leave the VM and its disk for ever. It fires this long after the
# deadline, as a backstop only; GCP deletes the VM at the deadline itself.
GUEST_TIMER_LAG_MIN = 10
WORKDIR = "/home/sortie/sortie"
SUBNET_CIDR = "10.42.0.0/18"
MAX_COMPACT_PLACEMENT = 22  # A2 compact placement group size limit (unverified)
# The guest agent regenerates host keys on first boot unless told not to: keep the pinned one.
GUEST_AGENT_CONFIG = ("/etc/default/instance_configs.cfg",
                      "[InstanceSetup]\nset_host_keys = false\n")


def gcp_labels(tags: dict[str, str]) -> dict[str, str]:
    """GCP labels take lowercase letters, digits, dashes and underscores, 63 at most."""
    def clean(text: str) -> str:
        return re.sub(r"[^a-z0-9_-]", "-", text.lower())[:63]
    return {clean(key): clean(value) for key, value in tags.items()}


def scheduling(spec: ClusterSpec, index: int) -> dict[str, Any]:
    """Scheduling for node `index`: GPUs must terminate on host maintenance; the TTL is
    `max_run_duration`, which requires a termination action (DELETE: nothing is left)."""
    ttl = {"max_run_duration": {"seconds": round(spec.ttl_hours * 3600)},
           "instance_termination_action": "DELETE", "on_host_maintenance": "TERMINATE"}
    if spec.is_spot(index):
        return {**ttl, "provisioning_model": "SPOT", "preemptible": True,
                "automatic_restart": False}
    return {**ttl, "provisioning_model": "STANDARD", "preemptible": False,
            "automatic_restart": True}


class GcpGpuCluster(pulumi.ComponentResource):
    """One sortie's GCP cluster. `outputs` has the cloud-neutral shape of `infra.outputs`."""

    def __init__(self, name: str, spec: ClusterSpec,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("sortie:gcp:GpuCluster", name, None, opts)
        self.spec = spec
        self.labels = gcp_labels(spec.sortie_tags())
        # A boot disk's `initialize_params` are create-only: a label there that moves (the
        # expiry, recomputed by a plain `pulumi up` without `sortie:expiresAt`) would replace
        # every VM. The disk keeps the labels that never change; the instance has them all.
        self.disk_labels = gcp_labels({key: value for key, value in spec.sortie_tags().items()
                                       if key != TAG_EXPIRES})
        # The kinds that take no labels say whose they are in their description: teardown's
        # sweep finds them by name and then by this (two sorties may share a name).
        self.owner_note = f"sortie-id={spec.sortie_id or spec.cluster}"
        self.zone = spec.zone or spec.instance.regions[spec.region][0]
        self.network_tag = f"sortie-{spec.cluster}"[:63]
        # No project: the provider falls back to GOOGLE_PROJECT / gcloud's default project.
        provider = gcp.Provider(f"{name}-provider", project=spec.project, region=spec.region,
                                zone=self.zone, opts=pulumi.ResourceOptions(parent=self))
        self._provider = provider
        self._child = pulumi.ResourceOptions(parent=self, provider=provider)

        subnet = self._network(name)
        gpu_subnets = self._gpu_networks(name)
        self._gpu_nics = [{"subnetwork": gpu.id, "nic_type": "GVNIC"} for gpu in gpu_subnets]
        bucket_name = self._bucket(name)
        accounts = self._node_accounts(name, bucket_name)
        placement = self._placement(name)
        client_key, host_keys = ssh_keys(name, spec.nodes, self)
        nodes = [self._node(name, i, subnet, accounts[i], placement, client_key, host_keys[i])
                 for i in range(spec.nodes)]

        self.outputs = cluster_outputs(
            spec, nodes, ssh_user=SSH_USER, workdir=WORKDIR,
            bucket_url=pulumi.Output.concat("gs://", bucket_name), client_key=client_key,
            zone=self.zone)
        self.register_outputs(self.outputs)

    def _part(self, kind: PartKind, name: str) -> Part:
        return Part(self, "gcp", kind, name, self._provider)

    def _network(self, name: str) -> gcp.compute.Subnetwork:
        part = self._part(NETWORK, f"{name}-network")
        child, tag = part.child, self.network_tag
        note = self.owner_note
        # Jumbo frames: a VPC's MTU is 1460 unless set, and NCCL over TCP between A2 VMs moves
        # its buffers in 1460-byte segments (Google: "Maximum transmission unit", up to 8896;
        # its A2/A3 NCCL guides set 8896).
        network = gcp.compute.Network(f"{name}-network", auto_create_subnetworks=False,
                                      mtu=GCP_VPC_MTU, description=note, opts=child)
        subnet = gcp.compute.Subnetwork(f"{name}-subnet", network=network.id,
                                        ip_cidr_range=SUBNET_CIDR, region=self.spec.region,
                                        description=note, opts=child)
        # One rule per address family: GCP refuses IPv4 and IPv6 ranges in one rule.
        families: dict[int, list[str]] = {}
        for cidr in self.spec.ssh_allowed_cidrs:
            families.setdefault(ipaddress.ip_network(cidr).version, []).append(cidr)
        for version, cidrs in sorted(families.items()):
            gcp.compute.Firewall(f"{name}-ssh-ipv{version}", network=network.id,
                                 direction="INGRESS", allows=[{"protocol": "tcp",
                                                               "ports": ["22"]}],
                                 source_ranges=cidrs, target_tags=[tag], opts=child,
                                 description=f"SSH from the allowed networks ({note})")
        gcp.compute.Firewall(f"{name}-intra-cluster", network=network.id, direction="INGRESS",
                             allows=[{"protocol": "all"}], source_tags=[tag], target_tags=[tag],
                             description=f"all traffic among cluster nodes (NCCL; {note})",
                             opts=child)
        part.done({"subnet_id": subnet.id})
        return subnet

    def _gpu_networks(self, name: str) -> list[gcp.compute.Subnetwork]:
        """A3's GPU NICs' networks (none for A2): one VPC network and subnet per NIC, traffic
        among the cluster's GPU NIC subnets allowed, nothing from anywhere else."""
        nics = self.spec.instance.network_cards
        if not nics:
            return []
        part = self._part(NETWORK, f"{name}-gpu-networks")
        subnets = []
        for index in range(nics):
            network = gcp.compute.Network(
                f"{name}-gpu-net-{index}", auto_create_subnetworks=False, mtu=GPU_NIC_MTU,
                description=self.owner_note, opts=part.child)
            subnets.append(gcp.compute.Subnetwork(
                f"{name}-gpu-subnet-{index}", network=network.id, region=self.spec.region,
                ip_cidr_range=GPU_NIC_CIDR.format(index=index), description=self.owner_note,
                opts=part.child))
            gcp.compute.Firewall(
                f"{name}-gpu-net-{index}-internal", network=network.id, direction="INGRESS",
                allows=[{"protocol": "tcp"}, {"protocol": "udp"}, {"protocol": "icmp"}],
                source_ranges=[GPU_NIC_RANGE], description=f"GPU NIC traffic ({self.owner_note})",
                opts=part.child)
        part.done({"subnet_ids": [subnet.id for subnet in subnets]})
        return subnets

    def _bucket(self, name: str) -> pulumi.Output[str]:
        if self.spec.bucket_name:  # not ours: no settings are changed on it
            return pulumi.Output.from_input(self.spec.bucket_name)
        days = self.spec.bucket_expiry_days
        part = self._part(BUCKET, f"{name}-bucket")
        bucket = gcp.storage.Bucket(
            f"{name}-bucket", location=self.spec.region.upper(), force_destroy=True,
            uniform_bucket_level_access=True, public_access_prevention="enforced",
            versioning={"enabled": True}, labels=self.labels, opts=part.child,
            lifecycle_rules=[
                {"action": {"type": "Delete"}, "condition": {"age": days}},
                {"action": {"type": "Delete"}, "condition": {"days_since_noncurrent_time": days}},
            ])
        part.done({"name": bucket.name})
        return bucket.name

    def _node_accounts(self, name: str, bucket_name: pulumi.Input[str]
                       ) -> list[gcp.serviceaccount.Account]:
        """A service account per node, each with object access on this cluster's bucket; each
        is granted its own node's host key with the node (`_host_key_secret`)."""
        part = self._part(NODE_ACCESS, f"{name}-node-access")
        accounts = []
        for index in range(self.spec.nodes):
            account = gcp.serviceaccount.Account(
                f"{name}-node-{index}-account",
                account_id=node_account_id(self.spec.cluster, index),
                display_name=f"sortie {self.spec.cluster} node-{index}",
                description=self.owner_note, opts=part.child)
            gcp.storage.BucketIAMMember(f"{name}-node-{index}-bucket-access", bucket=bucket_name,
                                        role="roles/storage.objectAdmin", member=account.member,
                                        opts=part.child)
            accounts.append(account)
        part.done({"emails": [account.email for account in accounts]})
        return accounts

    def _placement(self, name: str) -> gcp.compute.ResourcePolicy | None:
        """A compact placement policy when the node count allows one (2 to the limit). No
        `vm_count`: with it, exactly that many instances must be created at the same time (the
        SDK's docstring), which refuses the one new instance of a recovery."""
        if not 2 <= self.spec.nodes <= MAX_COMPACT_PLACEMENT:
            return None
        return gcp.compute.ResourcePolicy(
            f"{name}-placement", region=self.spec.region, opts=self._child,
            description=self.owner_note, group_placement_policy={"collocation": "COLLOCATED"})

    def _node(self, name: str, index: int, subnet: gcp.compute.Subnetwork,
              account: gcp.serviceaccount.Account,
              placement: gcp.compute.ResourcePolicy | None, client_key: tls.PrivateKey,
              host_key: tls.PrivateKey) -> pulumi.Output[dict[str, Any]]:
        spec, node_name = self.spec, f"node-{index}"
        part = self._part(NODE, node_part_name(name, node_name))
        fetch, secret_ready = self._host_key_secret(name, node_name, part, account, host_key)
        user_data = node_cloud_init(host_key, fetch, spec, PYTHONS,
                                    (GUEST_AGENT_CONFIG, HOST_KEY_FETCHER),
                                    timer_lag_min=GUEST_TIMER_LAG_MIN)
        metadata = {
            "block-project-ssh-keys": "TRUE",
            "enable-oslogin": "FALSE",  # the key below is the only way in
            "ssh-keys": client_key.public_key_openssh.apply(
                lambda key: f"{SSH_USER}:{key.strip()} {SSH_USER}"),
            "user-data": user_data,
        }
        instance = gcp.compute.Instance(
            f"{name}-{node_name}", name=f"sortie-{spec.cluster}-{node_name}"[:63],
            machine_type=spec.instance_type, zone=self.zone,
            boot_disk={"initialize_params": {"image": spec.image or spec.instance.image,
                                             "size": spec.root_volume_gb,
                                             "type": "pd-balanced",
                                             "labels": self.disk_labels}},
            network_interfaces=[{"subnetwork": subnet.id, "access_configs": [{}],
                                 "nic_type": "GVNIC"}, *self._gpu_nics],
            service_account={"email": account.email, "scopes": ["cloud-platform"]},
            metadata=metadata, scheduling=scheduling(spec, index),
            resource_policies=placement.self_link if placement else None,
            tags=[self.network_tag], labels={**self.labels, "sortie-node": node_name},
            opts=pulumi.ResourceOptions.merge(
                part.child, pulumi.ResourceOptions(depends_on=secret_ready)))
        interface = instance.network_interfaces[0]
        node = node_output(node_name, interface.access_configs[0].nat_ip,
                           interface.network_ip, host_key, spot=spec.is_spot(index))
        part.done({"node": node})
        return node

    def _host_key_secret(self, name: str, node_name: str, part: Part,
                         account: gcp.serviceaccount.Account, host_key: tls.PrivateKey
                         ) -> tuple[pulumi.Output[str], list[pulumi.Resource]]:
        """The node's host private key as a Secret Manager secret only its own service account
        may read: the command that fetches it at boot, and what must exist before the node."""
        secret = gcp.secretmanager.Secret(
            f"{name}-{node_name}-host-key", secret_id=host_key_secret_id(self.spec.cluster,
                                                                         node_name),
            replication={"auto": {}}, labels={**self.labels, "sortie-node": node_name},
            opts=part.child)
        version = gcp.secretmanager.SecretVersion(
            f"{name}-{node_name}-host-key-value", secret=secret.id,
            secret_data=host_key.private_key_openssh, opts=part.child)
        grant = gcp.secretmanager.SecretIamMember(
            f"{name}-{node_name}-host-key-access", secret_id=secret.secret_id,
            project=secret.project, role=SECRET_ACCESSOR, member=account.member,
            opts=part.child)
        # The image's python3 and the standard library, signed in as the node's service account
        # through the metadata server: no gcloud needed on root's PATH.
        fetch = pulumi.Output.all(secret.secret_id, secret.project).apply(
            lambda v: "python3 " + shlex.join([HOST_KEY_FETCHER[0], v[1], v[0]]))
        return fetch, [version, grant]


def host_key_secret_id(cluster: str, node_name: str) -> str:
    return f"sortie-{cluster}-host-key-{node_name}"


def interconnect(spec: ClusterSpec) -> str:
    """Between the nodes, in words, for `sortie plan`."""
    compact = "compact placement" if 2 <= spec.nodes <= MAX_COMPACT_PLACEMENT else \
        "no compact placement"
    kind = spec.instance
    if not kind.network_cards:
        return f"TCP (gVNIC, {compact}; A2 has no RDMA network)"
    return (f"{kind.network_cards} GPU NICs, each in a VPC network of its own (MTU "
            f"{GPU_NIC_MTU}), {compact}; {GPUDIRECT_NOT_BUILT}")


# What a real A3 cluster still lacks from sortie: said in `plan` and in docs/clouds.md.
GPUDIRECT_NOT_BUILT = (
    "GPUDirect-TCPX(O)'s receive data path manager and NCCL net plugin are not installed (Google's "
    "guide runs them as containers on Container-Optimized OS): NCCL runs over TCP sockets")
