"""`AwsGpuCluster`: an EC2 P3/P4d cluster, its network, bucket and access, as one component with
the subtrees of `infra/parts.py` (Network, Bucket, NodeAccess, one Node per node).

Security and cost choices, each asserted by tests/test_aws_program.py:
- SSH (22) is open only to `sshAllowedCidrs`; members reach each other on everything (NCCL uses
  ephemeral ports, EFA needs a self-referencing rule in and out).
- The bucket is private, encrypted, versioned, TLS-only and expires objects; the nodes' role can
  reach this bucket and nothing else.
- Nodes come from one launch template (EFA interfaces must be there at launch), require IMDSv2,
  terminate when they power off (the TTL timer in cloud-init), and run workers on spot when asked.

What a first real `pulumi up` needs, each pinned by a test:
- Without a `zone`, the subnet goes in the first zone (by name) that offers the instance type:
  AWS's own pick may be a zone without it. The controller tries the others in turn.
- Nodes launch from the template's *default* version, which never moves: a newer Deep Learning
  AMI found by a later `up` (a recovery) makes a new template version, but the healthy nodes'
  arguments stay the same, so they are not replaced (`launch_template` forces replacement); a
  replacement node gets the image its cluster started with.
- Extra network cards carry EFA-only interfaces (no IP address of their own); a node with
  several cards gets its public address from an Elastic IP, after the internet gateway exists.
- A node's host private key is not in its user data (which any process on the node, through
  IMDS, and anyone who may read instance attributes can read): it is a Secrets Manager secret of
  its own, which only that instance may read (a resource policy denies the nodes' role from
  any other instance, by `ec2:SourceInstanceARN`), fetched by cloud-init at boot. The nodes may
  read host-key secrets only once every secret's policy exists (the grant waits for them)."""

from __future__ import annotations

import ipaddress
import json
import shlex
from typing import Any

import pulumi
import pulumi_aws as aws
import pulumi_tls as tls

from sortie.infra.aws.facts import bucket_prefix, iam_name_prefix
from sortie.infra.outputs import cluster_outputs, node_cloud_init, node_output, ssh_keys
from sortie.infra.parts import BUCKET, NETWORK, NODE, NODE_ACCESS, Part, PartKind, node_part_name
from sortie.infra.spec import ClusterSpec, SpecError

SSH_USER = "ubuntu"  # the Deep Learning AMIs (Ubuntu)
# Where the DLAMI's PyTorch environment may be (probed at boot, in this order).
PYTHONS = ("/opt/pytorch/bin/python3", "/opt/conda/bin/python3", "/usr/bin/python3")
WORKDIR = "/home/ubuntu/sortie"
VPC_CIDR, SUBNET_CIDR = "10.42.0.0/16", "10.42.0.0/18"
ROOT_DEVICE = "/dev/sda1"  # Ubuntu AMIs; used when an image override hides the real name


class AwsGpuCluster(pulumi.ComponentResource):
    """One sortie's AWS cluster. `outputs` has the cloud-neutral shape of `infra.outputs`."""

    def __init__(self, name: str, spec: ClusterSpec,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("sortie:aws:GpuCluster", name, None, opts)
        self.spec = spec
        self.tags = spec.sortie_tags()
        provider = aws.Provider(f"{name}-provider", region=spec.region,
                                opts=pulumi.ResourceOptions(parent=self))
        self._provider = provider
        self._child = pulumi.ResourceOptions(parent=self, provider=provider)

        subnet, security_group, gateway = self._network(name)
        bucket_name, bucket_arn = self._bucket(name)
        role, profile = self._node_role(name, bucket_arn)
        self._key_policies: list[aws.secretsmanager.SecretPolicy] = []
        client_key, host_keys = ssh_keys(name, spec.nodes, self)
        key_pair = aws.ec2.KeyPair(f"{name}-key", key_name_prefix=f"sortie-{spec.cluster}-",
                                   public_key=client_key.public_key_openssh, tags=self.tags,
                                   opts=self._child)
        placement = aws.ec2.PlacementGroup(f"{name}-placement", strategy="cluster",
                                           tags=self.tags, opts=self._child)
        template = self._launch_template(name, subnet, security_group, profile, key_pair,
                                         placement)
        nodes = [self._node(name, i, template, placement, gateway, host_keys[i], role.arn)
                 for i in range(spec.nodes)]
        self._host_key_grant(name, role)

        self.outputs = cluster_outputs(
            spec, nodes, ssh_user=SSH_USER, workdir=WORKDIR,
            bucket_url=pulumi.Output.concat("s3://", bucket_name), client_key=client_key,
            zone=subnet.availability_zone, train_env=efa_env(spec))
        self.register_outputs(self.outputs)

    def _part(self, kind: PartKind, name: str) -> Part:
        return Part(self, "aws", kind, name, self._provider)

    def _zone(self) -> pulumi.Input[str]:
        """The profile's zone, else the first zone (by name) that offers the instance type."""
        if self.spec.zone:
            return self.spec.zone
        offerings = aws.ec2.get_instance_type_offerings_output(
            location_type="availability-zone", region=self.spec.region,
            filters=[{"name": "instance-type", "values": [self.spec.instance_type]}],
            opts=pulumi.InvokeOutputOptions(parent=self, provider=self._provider))
        return offerings.locations.apply(lambda zones: first_offering_zone(self.spec, zones))

    def _network(self, name: str
                 ) -> tuple[aws.ec2.Subnet, aws.ec2.SecurityGroup, aws.ec2.InternetGateway]:
        part = self._part(NETWORK, f"{name}-network")
        tags, child = self.tags, part.child
        vpc = aws.ec2.Vpc(f"{name}-vpc", cidr_block=VPC_CIDR, enable_dns_hostnames=True,
                          enable_dns_support=True, tags=tags, opts=child)
        subnet = aws.ec2.Subnet(f"{name}-subnet", vpc_id=vpc.id, cidr_block=SUBNET_CIDR,
                                availability_zone=self._zone(), map_public_ip_on_launch=True,
                                tags=tags, opts=child)
        gateway = aws.ec2.InternetGateway(f"{name}-igw", vpc_id=vpc.id, tags=tags, opts=child)
        routes = aws.ec2.RouteTable(f"{name}-routes", vpc_id=vpc.id, tags=tags, opts=child)
        aws.ec2.Route(f"{name}-default-route", route_table_id=routes.id,
                      destination_cidr_block="0.0.0.0/0", gateway_id=gateway.id, opts=child)
        aws.ec2.RouteTableAssociation(f"{name}-routes-assoc", route_table_id=routes.id,
                                      subnet_id=subnet.id, opts=child)

        group = aws.ec2.SecurityGroup(f"{name}-sg", vpc_id=vpc.id, tags=tags, opts=child,
                                      description=f"sortie cluster {self.spec.cluster}")
        for i, cidr in enumerate(self.spec.ssh_allowed_cidrs):
            family = "cidr_ipv6" if ipaddress.ip_network(cidr).version == 6 else "cidr_ipv4"
            aws.vpc.SecurityGroupIngressRule(
                f"{name}-ssh-{i}", security_group_id=group.id, ip_protocol="tcp", from_port=22,
                to_port=22, description="SSH from an allowed network", tags=tags, opts=child,
                **{family: cidr})
        aws.vpc.SecurityGroupIngressRule(
            f"{name}-intra-cluster-in", security_group_id=group.id, ip_protocol="-1",
            referenced_security_group_id=group.id, tags=tags, opts=child,
            description="all traffic among cluster members (NCCL, EFA)")
        aws.vpc.SecurityGroupEgressRule(
            f"{name}-intra-cluster-out", security_group_id=group.id, ip_protocol="-1",
            referenced_security_group_id=group.id, tags=tags, opts=child,
            description="all traffic among cluster members (EFA requires it explicitly)")
        aws.vpc.SecurityGroupEgressRule(
            f"{name}-egress", security_group_id=group.id, ip_protocol="-1",
            cidr_ipv4="0.0.0.0/0", description="outbound: packages, bucket, cloud APIs",
            tags=tags, opts=child)
        part.done({"subnet_id": subnet.id, "security_group_id": group.id})
        return subnet, group, gateway

    def _bucket(self, name: str) -> tuple[pulumi.Output[str], pulumi.Output[str]]:
        """This cluster's bucket (created here, or an existing one by name): (name, ARN)."""
        if self.spec.bucket_name:  # not ours: no settings are changed on it
            arn = f"arn:aws:s3:::{self.spec.bucket_name}"
            return pulumi.Output.from_input(self.spec.bucket_name), pulumi.Output.from_input(arn)
        part = self._part(BUCKET, f"{name}-bucket")
        child = part.child
        # force_destroy: a sortie's bucket goes with the stack; results are copied out first.
        bucket = aws.s3.Bucket(f"{name}-bucket", bucket_prefix=bucket_prefix(self.spec.cluster),
                               force_destroy=True, tags=self.tags, opts=child)
        public_block = aws.s3.BucketPublicAccessBlock(
            f"{name}-bucket-public-access", bucket=bucket.id, block_public_acls=True,
            block_public_policy=True, ignore_public_acls=True, restrict_public_buckets=True,
            opts=child)
        aws.s3.BucketServerSideEncryptionConfiguration(
            f"{name}-bucket-encryption", bucket=bucket.id, opts=child,
            rules=[{"apply_server_side_encryption_by_default": {"sse_algorithm": "AES256"}}])
        aws.s3.BucketVersioning(f"{name}-bucket-versioning", bucket=bucket.id,
                                versioning_configuration={"status": "Enabled"}, opts=child)
        days = self.spec.bucket_expiry_days
        aws.s3.BucketLifecycleConfiguration(
            f"{name}-bucket-expiry", bucket=bucket.id, opts=child, rules=[{
                # An empty filter draws a provider warning that is to become an error.
                "id": "sortie-expiry", "status": "Enabled", "filter": {"prefix": ""},
                "expiration": {"days": days},
                "noncurrent_version_expiration": {"noncurrent_days": days}}])
        tls_only = pulumi.Output.json_dumps({"Version": "2012-10-17", "Statement": [{
            "Sid": "DenyInsecureTransport", "Effect": "Deny", "Principal": "*",
            "Action": "s3:*", "Resource": [bucket.arn, pulumi.Output.concat(bucket.arn, "/*")],
            "Condition": {"Bool": {"aws:SecureTransport": "false"}}}]})
        # After the public access block: S3 rejects policies while it is being applied.
        aws.s3.BucketPolicy(f"{name}-bucket-tls-only", bucket=bucket.id, policy=tls_only,
                            opts=pulumi.ResourceOptions.merge(
                                child, pulumi.ResourceOptions(depends_on=[public_block])))
        part.done({"name": bucket.bucket})
        return bucket.bucket, bucket.arn

    def _node_role(self, name: str, bucket_arn: pulumi.Output[str]
                   ) -> tuple[aws.iam.Role, aws.iam.InstanceProfile]:
        part = self._part(NODE_ACCESS, f"{name}-node-access")
        child = part.child
        assume = json.dumps({"Version": "2012-10-17", "Statement": [{
            "Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"},
            "Action": "sts:AssumeRole"}]})
        role = aws.iam.Role(f"{name}-node-role", name_prefix=iam_name_prefix(self.spec.cluster),
                            assume_role_policy=assume, tags=self.tags, opts=child)
        bucket_only = pulumi.Output.json_dumps({"Version": "2012-10-17", "Statement": [
            {"Sid": "ListClusterBucket", "Effect": "Allow",
             "Action": ["s3:ListBucket", "s3:GetBucketLocation"], "Resource": [bucket_arn]},
            {"Sid": "ObjectsInClusterBucket", "Effect": "Allow",
             "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject",
                        "s3:AbortMultipartUpload"],
             "Resource": [pulumi.Output.concat(bucket_arn, "/*")]}]})
        aws.iam.RolePolicy(f"{name}-node-bucket-access", role=role.id, policy=bucket_only,
                           opts=child)
        profile = aws.iam.InstanceProfile(f"{name}-node-profile", role=role.name,
                                          tags=self.tags, opts=child,
                                          name_prefix=iam_name_prefix(self.spec.cluster))
        part.done({"instance_profile_arn": profile.arn})
        self._access = part
        return role, profile

    def _host_key_grant(self, name: str, role: aws.iam.Role) -> None:
        """Let the nodes read the host-key secrets once every secret's policy is in place: each
        policy names its instance, so it comes after it, and a grant made before them would let
        any node read every node's key for that while (cloud-init retries until it works)."""
        grant = json.dumps({"Version": "2012-10-17", "Statement": [{
            # Each node reads its own host key; each secret's policy refuses the other nodes.
            "Sid": "OwnHostKey", "Effect": "Allow", "Action": ["secretsmanager:GetSecretValue"],
            "Resource": [f"arn:aws:secretsmanager:{self.spec.region}:*:secret:"
                         f"{host_key_secret_prefix(self.spec.cluster)}*"]}]})
        aws.iam.RolePolicy(f"{name}-node-host-keys", role=role.id, policy=grant,
                           opts=pulumi.ResourceOptions.merge(self._access.child,
                               pulumi.ResourceOptions(depends_on=self._key_policies)))

    def _image_id(self) -> tuple[pulumi.Input[str], pulumi.Input[str]]:
        """(AMI id, root device name): the override, or the newest DLAMI for the GPU."""
        if self.spec.image:
            return self.spec.image, ROOT_DEVICE
        ami = aws.ec2.get_ami_output(
            # The preflight (`infra/aws/home.py`) asked the same before anything was made.
            most_recent=True, owners=["amazon"], include_deprecated=False,
            filters=[{"name": "name", "values": [self.spec.instance.image]},
                     {"name": "architecture", "values": ["x86_64"]},
                     {"name": "state", "values": ["available"]}],
            opts=pulumi.InvokeOutputOptions(parent=self, provider=self._child.provider))
        return ami.id, ami.root_device_name

    def _launch_template(self, name: str, subnet: aws.ec2.Subnet,
                         group: aws.ec2.SecurityGroup, profile: aws.iam.InstanceProfile,
                         key_pair: aws.ec2.KeyPair, placement: aws.ec2.PlacementGroup
                         ) -> aws.ec2.LaunchTemplate:
        kind = self.spec.instance
        image_id, root_device = self._image_id()
        interfaces = [{
            # AWS's layout for EFA on several cards: the primary interface (card 0, device 0)
            # is EFA with ENA (IP traffic); every other card carries one EFA-only interface,
            # device 0, which takes no IP address from the subnet.
            "network_card_index": card, "device_index": 0,
            "subnet_id": subnet.id, "security_groups": [group.id],
            "delete_on_termination": "true",  # launch templates take strings here
            **({"interface_type": "efa" if card == 0 else "efa-only"}
               if kind.interconnect == "efa" else {}),
            # Several network cards get no automatic public IP: an Elastic IP per node instead.
            **({"associate_public_ip_address": "true"} if kind.network_cards <= 1 else {}),
        } for card in range(max(1, kind.network_cards))]
        tagged = [{"resource_type": kind_, "tags": self.tags}
                  for kind_ in ("instance", "volume", "network-interface")]
        return aws.ec2.LaunchTemplate(
            f"{name}-template", name_prefix=f"sortie-{self.spec.cluster}-",
            image_id=image_id, instance_type=kind.name, key_name=key_pair.key_name,
            iam_instance_profile={"arn": profile.arn}, placement={"group_name": placement.name},
            network_interfaces=interfaces, instance_initiated_shutdown_behavior="terminate",
            metadata_options={"http_tokens": "required", "http_endpoint": "enabled",
                              "http_put_response_hop_limit": 2},
            block_device_mappings=[{"device_name": root_device, "ebs": {
                "volume_size": self.spec.root_volume_gb, "volume_type": "gp3",
                "encrypted": "true", "delete_on_termination": "true"}}],
            # Nodes launch from the default version, which stays the first (see the top).
            update_default_version=False,
            tag_specifications=tagged, tags=self.tags, opts=self._child)

    def _node(self, name: str, index: int, template: aws.ec2.LaunchTemplate,
              placement: aws.ec2.PlacementGroup, gateway: aws.ec2.InternetGateway,
              host_key: tls.PrivateKey, role_arn: pulumi.Output[str]
              ) -> pulumi.Output[dict[str, Any]]:
        spec, node_name = self.spec, f"node-{index}"
        part = self._part(NODE, node_part_name(name, node_name))
        market = None
        if spec.is_spot(index):
            spot_options: dict[str, Any] = {"spot_instance_type": "one-time",
                                            "instance_interruption_behavior": "terminate"}
            if spec.spot_max_price is not None:
                spot_options["max_price"] = f"{spec.spot_max_price:.4f}"  # EC2 takes a string
            market = {"market_type": "spot", "spot_options": spot_options}
        secret = aws.secretsmanager.Secret(
            f"{name}-{node_name}-host-key",
            name=f"{host_key_secret_prefix(spec.cluster)}{node_name}",
            description=f"SSH host private key of sortie {spec.cluster} {node_name}",
            recovery_window_in_days=0,  # deleted at once with the stack: nothing is left
            tags=self.tags, opts=part.child)
        aws.secretsmanager.SecretVersion(f"{name}-{node_name}-host-key-value", secret_id=secret.id,
                                         secret_string=host_key.private_key_openssh,
                                         opts=part.child)
        # Each node gets its own host key, so its user data overrides the template's (none).
        fetch = secret.arn.apply(lambda arn: fetch_secret(spec.region, arn))
        user_data = node_cloud_init(host_key, fetch, spec, PYTHONS)
        tags = {**self.tags, "Name": f"sortie-{spec.cluster}-{node_name}",
                "sortie-node": node_name}
        instance = aws.ec2.Instance(
            f"{name}-{node_name}", launch_template={"id": template.id, "version": "$Default"},
            # Also here, not only in the template: the instance then says it is in the group.
            placement_group=placement.name,
            instance_market_options=market, user_data=user_data,
            user_data_replace_on_change=True, tags=tags, opts=part.child)
        self._key_policies.append(aws.secretsmanager.SecretPolicy(
            f"{name}-{node_name}-host-key-policy", secret_arn=secret.arn,
            policy=only_from_instance(instance.arn, role_arn), opts=part.child))
        public_ip: pulumi.Input[str] = instance.public_ip
        if spec.instance.network_cards > 1:
            # An Elastic IP needs the VPC's internet gateway attached first.
            eip = aws.ec2.Eip(f"{name}-{node_name}-ip", domain="vpc",
                              network_interface=instance.primary_network_interface_id,
                              tags=tags, opts=pulumi.ResourceOptions.merge(
                                  part.child, pulumi.ResourceOptions(depends_on=[gateway])))
            public_ip = eip.public_ip
        node = node_output(node_name, public_ip, instance.private_ip, host_key,
                           spot=spec.is_spot(index))
        part.done({"node": node})
        return node


# Where the Deep Learning AMIs put the aws-ofi-nccl plugin (libnccl-net.so: newest images in a
# multiarch folder, then newer, then older) and libfabric; a job's non-login SSH shell reads no
# /etc/profile.d, so the job's environment names them itself. (NCCL also finds the plugin
# through /etc/ld.so.conf.d, which the node check reads too: `ldconfig -p`.)
OFI_NCCL_LIBS = ("/opt/amazon/ofi-nccl/lib/x86_64-linux-gnu", "/opt/amazon/ofi-nccl/lib",
                 "/opt/aws-ofi-nccl/lib", "/opt/amazon/efa/lib")


def efa_env(spec: ClusterSpec) -> dict[str, str] | None:
    """What NCCL needs to go over EFA rather than fall back to sockets (p4d with 4 EFA: ≈ 78
    GB/s all-reduce bus bandwidth against ≈ 8): libfabric's EFA provider, the plugin on the
    library path, and GPUDirect RDMA where the GPU has it (A100; not the V100 of p3dn)."""
    kind = spec.instance
    if kind.interconnect != "efa":
        return None
    env = {"FI_PROVIDER": "efa", "LD_LIBRARY_PATH": ":".join(OFI_NCCL_LIBS)}
    if kind.gpu_model != "V100":
        env["FI_EFA_USE_DEVICE_RDMA"] = "1"
    return env


# Where the AWS CLI may be on a Deep Learning AMI: root's PATH may lack it (it can live only in
# the PyTorch environment); with none, the Python SDK those environments have.
AWS_CLIS = ("aws", "/usr/local/bin/aws", "/opt/pytorch/bin/aws", "/opt/conda/bin/aws")


def fetch_secret(region: str, arn: str) -> str:
    """The boot-time command that prints a secret's value (the node's host private key)."""
    cli = (f"secretsmanager get-secret-value --region {region} --secret-id {arn} "
           "--query SecretString --output text")
    sdk = shlex.quote(f"import boto3; print(boto3.client('secretsmanager', region_name="
                      f"'{region}').get_secret_value(SecretId='{arn}')['SecretString'])")
    return (f"for c in {' '.join(AWS_CLIS)}; do command -v \"$c\" >/dev/null && "
            f"exec \"$c\" {cli}; done; "
            f"for p in {' '.join(PYTHONS)}; do [ -x \"$p\" ] && \"$p\" -c 'import boto3' "
            f"2>/dev/null && exec \"$p\" -c {sdk}; done; "
            "echo 'sortie: neither the AWS CLI nor boto3 is on this image' >&2; exit 1")


def interconnect(spec: ClusterSpec) -> str:
    """Between the nodes, in words, for `sortie plan`."""
    kind = spec.instance
    if kind.interconnect != "efa":
        return "TCP (ENA; no EFA on this type)"
    rdma = ", GPUDirect RDMA" if (efa_env(spec) or {}).get("FI_EFA_USE_DEVICE_RDMA") else ""
    return (f"EFA × {kind.network_cards} (NCCL through the aws-ofi-nccl plugin, "
            f"FI_PROVIDER=efa{rdma}; the node check says if a node cannot use it)")


def host_key_secret_prefix(cluster: str) -> str:
    return f"sortie-{cluster}-host-key-"


def only_from_instance(instance_arn: pulumi.Input[str],
                       role_arn: pulumi.Input[str]) -> pulumi.Output[str]:
    """A secret's resource policy: the nodes' role reads it only from this instance. Scoped
    to that role (`aws:PrincipalArn`, the role's ARN for its sessions): `ec2:SourceInstanceARN`
    is on every request signed with instance-profile credentials, so a Deny on it alone would
    also refuse a deployer or CI runner on EC2 refreshing the stack. The role's credentials used
    anywhere else (no such key) are refused too."""
    return pulumi.Output.json_dumps({"Version": "2012-10-17", "Statement": [{
        "Sid": "OnlyItsOwnNode", "Effect": "Deny", "Principal": "*",
        "Action": "secretsmanager:GetSecretValue", "Resource": "*",
        "Condition": {"ArnEquals": {"aws:PrincipalArn": role_arn},
                      "StringNotEquals": {"ec2:SourceInstanceARN": instance_arn}}}]})


def first_offering_zone(spec: ClusterSpec, zones: list[str] | None) -> str:
    """The first zone, by name, of those that offer the instance type."""
    if not zones:
        raise SpecError(f"sortie:region: no zone of {spec.region} offers {spec.instance_type} "
                        "(check the region, or the account's access to the type)")
    return sorted(zones)[0]
