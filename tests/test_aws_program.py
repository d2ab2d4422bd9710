"""The AWS program, run for real under Pulumi's mock runtime (`pulumi.runtime.set_mocks`).

Every assertion reads the resources the program declared, as the engine would receive them: the
security and cost invariants hold for what would actually be created, not for the spec.
"""

from __future__ import annotations

import ipaddress
import json
import runpy
from pathlib import Path

import pulumi
import pytest
import yaml

from sortie.infra.aws.facts import AWS_DLAMI_OSS, AWS_DLAMI_PROPRIETARY
from sortie.infra.cloud_init import PYTHON_LINK, RSYNC_IF_MISSING
from sortie.infra.offline import OfflineMocks, RecordingMonitor, config_strings, evaluate
from sortie.infra.program import summarize_security
from sortie.infra.review import Evaluation
from sortie.infra.spec import TAG_CLUSTER, TAG_EXPIRES, TAG_OWNER, TAG_RUN, SpecError
from sortie.stacks.cloud.outputs import inventory_from_outputs
from tests.helpers import (
    evaluate_profile,
    evaluate_with,
    node_parts,
    sdk_accepts,
    starts_host_key_fetch,
    subtrees,
)

# Each test's mark is its own: `unit` starts no process, `e2e` does (issue 63).

INGRESS = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
EGRESS = "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule"
INSTANCE = "aws:ec2/instance:Instance"
TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
BASE = {"sortie:cloud": "aws", "sortie:region": "us-east-1",
        "sortie:instanceType": "p3.2xlarge", "sortie:sshAllowedCidrs": ["198.51.100.7/32"]}


def run(**settings) -> Evaluation:
    return evaluate_with(BASE, **settings)


def instances(evaluation: Evaluation) -> dict[str, dict]:
    return {r.state["tags"]["sortie-node"]: r.state for r in evaluation.of_type(INSTANCE)}


@pytest.fixture(scope="module", params=["aws-p3-dev", "aws-p4d", "aws-p5"])
def profile(request) -> Evaluation:
    return evaluate_profile(request.param)


# -- each shipped profile ------------------------------------------------------------------------

@pytest.mark.unit
def test_ssh_open_only_to_the_allowed_cidrs(profile: Evaluation):
    allowed = set(profile.spec.ssh_allowed_cidrs)
    for rule in (r.state for r in profile.of_type(INGRESS)):
        cidr = rule.get("cidrIpv4") or rule.get("cidrIpv6")
        if cidr is None:  # the intra-cluster rule: members only
            assert rule["referencedSecurityGroupId"] == rule["securityGroupId"]
            continue
        assert cidr in allowed
        assert ipaddress.ip_network(cidr).prefixlen > 0
        assert (rule["ipProtocol"], rule["fromPort"], rule["toPort"]) == ("tcp", 22, 22)
    assert "0.0.0.0/0" not in json.dumps([r.state for r in profile.of_type(INGRESS)])


@pytest.mark.unit
def test_members_reach_each_other_on_everything(profile: Evaluation):
    group = profile.only("aws:ec2/securityGroup:SecurityGroup")
    assert "ingress" not in group.state and "egress" not in group.state  # rules are resources
    for token in (INGRESS, EGRESS):
        assert any(r.state["ipProtocol"] == "-1"
                   and r.state.get("referencedSecurityGroupId") == r.state["securityGroupId"]
                   for r in profile.of_type(token)), f"no self-referencing {token}"


@pytest.mark.unit
def test_bucket_private_encrypted_versioned_tls_only_expiring(profile: Evaluation):
    bucket = profile.only("aws:s3/bucket:Bucket").state
    block = profile.only("aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock").state
    assert all(block[flag] is True for flag in ("blockPublicAcls", "blockPublicPolicy",
                                                "ignorePublicAcls", "restrictPublicBuckets"))
    sse = profile.only("aws:s3/bucketServerSideEncryptionConfiguration:"
                       "BucketServerSideEncryptionConfiguration").state
    assert sse["rules"][0]["applyServerSideEncryptionByDefault"]["sseAlgorithm"] == "AES256"
    versioning = profile.only("aws:s3/bucketVersioning:BucketVersioning").state
    assert versioning["versioningConfiguration"]["status"] == "Enabled"
    lifecycle = profile.only("aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration")
    rule = lifecycle.state["rules"][0]
    assert rule["status"] == "Enabled"
    assert rule["filter"] == {"prefix": ""}, "an empty filter is to become a provider error"
    assert rule["expiration"]["days"] == profile.spec.bucket_expiry_days
    policy = json.loads(profile.only("aws:s3/bucketPolicy:BucketPolicy").state["policy"])
    (deny,) = policy["Statement"]
    assert deny["Effect"] == "Deny" and deny["Principal"] == "*" and deny["Action"] == "s3:*"
    assert deny["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
    assert sorted(deny["Resource"]) == [bucket["arn"], bucket["arn"] + "/*"]
    for config in (block, sse, versioning, lifecycle.state):
        assert config["bucket"] == bucket["bucket"]


@pytest.mark.unit
def test_node_role_reaches_only_this_bucket_and_the_host_keys(profile: Evaluation):
    arn = profile.only("aws:s3/bucket:Bucket").state["arn"]
    statements = [statement for policy in profile.of_type("aws:iam/rolePolicy:RolePolicy")
                  for statement in json.loads(policy.state["policy"])["Statement"]]
    policy = {"Statement": statements}
    resources = {res for statement in policy["Statement"] for res in statement["Resource"]}
    host_keys = ("arn:aws:secretsmanager:us-east-1:*:secret:"
                 f"sortie-{profile.spec.cluster}-host-key-*")
    assert resources == {arn, arn + "/*", host_keys}
    actions = {action for statement in policy["Statement"] for action in statement["Action"]}
    assert all(a.startswith("s3:") or a == "secretsmanager:GetSecretValue" for a in actions)
    assert not any("*" in action for action in actions)
    assume = json.loads(profile.only("aws:iam/role:Role").state["assumeRolePolicy"])
    assert assume["Statement"][0]["Principal"] == {"Service": "ec2.amazonaws.com"}


@pytest.mark.unit
def test_launch_template_imdsv2_terminate_on_shutdown_encrypted_root(profile: Evaluation):
    template = profile.only(TEMPLATE).state
    assert template["metadataOptions"]["httpTokens"] == "required"
    assert template["instanceInitiatedShutdownBehavior"] == "terminate"
    (root,) = template["blockDeviceMappings"]
    assert root["ebs"]["encrypted"] == "true"
    assert root["ebs"]["volumeSize"] == profile.spec.root_volume_gb
    assert template["placement"]["groupName"]
    assert "vpcSecurityGroupIds" not in template  # conflicts with per-interface groups
    template_id = profile.only(TEMPLATE).name + "-id"  # the mock's id for it
    assert template["updateDefaultVersion"] is False
    placement = profile.only("aws:ec2/placementGroup:PlacementGroup").state
    assert placement["strategy"] == "cluster"
    for node in instances(profile).values():
        # The default version never moves: a new image makes a new version, not new nodes.
        assert node["launchTemplate"] == {"id": template_id, "version": "$Default"}
        assert node["placementGroup"] == placement["name"] == template["placement"]["groupName"]


@pytest.mark.unit
def test_efa_interfaces_by_instance_type(profile: Evaluation):
    interfaces = profile.only(TEMPLATE).state["networkInterfaces"]
    eips = profile.of_type("aws:ec2/eip:Eip")
    cards = {"p4d.24xlarge": 4, "p5.48xlarge": 32}.get(profile.spec.instance_type, 1)
    if cards > 1:  # every EFA network card the type has (Karpenter's reference: p5 32)
        assert len(interfaces) == cards == profile.spec.instance.network_cards
        assert [i["networkCardIndex"] for i in interfaces] == list(range(cards))
        assert [i["deviceIndex"] for i in interfaces] == [0] * cards
        # The primary is EFA with ENA; the other cards' EFA-only interfaces take no address.
        assert [i["interfaceType"] for i in interfaces] == ["efa"] + ["efa-only"] * (cards - 1)
        assert all("associatePublicIpAddress" not in i for i in interfaces)
        assert len(eips) == profile.spec.nodes  # several cards: public IPs come from EIPs
        gateway = profile.only("aws:ec2/internetGateway:InternetGateway").urn
        assert all(gateway in eip.depends_on for eip in eips), "an EIP needs the gateway"
    else:
        (only,) = interfaces
        assert "interfaceType" not in only
        assert only["associatePublicIpAddress"] == "true"  # a string in launch templates
        assert not eips
    assert all(i["deleteOnTermination"] == "true" for i in interfaces)


@pytest.mark.unit
def test_nccl_goes_over_efa_where_the_type_has_it(profile: Evaluation):
    """A job's non-login SSH shell sets nothing of the EFA stack: without these NCCL falls back
    to sockets, silently and about ten times slower (before: nothing was set)."""
    env = profile.outputs.get("train_env", {})
    if profile.spec.instance.interconnect == "efa":
        assert env["FI_PROVIDER"] == "efa" and env["FI_EFA_USE_DEVICE_RDMA"] == "1"
        assert env["LD_LIBRARY_PATH"].split(":")[:2] == [
            "/opt/amazon/ofi-nccl/lib/x86_64-linux-gnu", "/opt/amazon/ofi-nccl/lib"]
    else:
        assert "FI_PROVIDER" not in env
    p3dn = run(instanceType="p3dn.24xlarge", zone="us-east-1b").outputs["train_env"]
    assert p3dn["FI_PROVIDER"] == "efa" and "FI_EFA_USE_DEVICE_RDMA" not in p3dn  # no V100 RDMA


@pytest.mark.e2e
def test_the_host_key_fetch_finds_the_aws_cli_off_roots_path(tmp_path: Path):
    """On a Deep Learning AMI the AWS CLI may live only in the PyTorch environment (before: a
    bare `aws`, not found on root's PATH, and sshd never started). The boot command, run for
    real with a stand-in CLI where the image may keep it."""
    import subprocess

    from sortie.infra.aws.program import AWS_CLIS, fetch_secret

    assert "/opt/pytorch/bin/aws" in AWS_CLIS
    stub = tmp_path / "aws"
    stub.write_text('#!/bin/sh\necho "KEY from $*"\n')
    stub.chmod(0o755)
    arn = "arn:aws:secretsmanager:us-east-1:1:secret:sortie-edge-host-key-node-0"
    command = fetch_secret("us-east-1", arn)
    done = subprocess.run(["sh", "-c", f"key=$({command}) && echo \"$key\""],
                          env={"PATH": f"{tmp_path}:/usr/bin:/bin"}, capture_output=True,
                          text=True, timeout=30)
    assert done.stdout == (f"KEY from secretsmanager get-secret-value --region us-east-1 "
                           f"--secret-id {arn} --query SecretString --output text\n")


@pytest.mark.e2e
def test_the_node_check_says_whether_nccl_can_use_efa(tmp_path: Path):
    """The probe each node runs, run here: the plugin on the library path and libfabric's
    provider listed make "ofi"; either missing is named."""
    import subprocess
    import sys

    from sortie.bootstrap.checks import PROBE, NodeFacts

    plugin, bin_dir = tmp_path / "ofi", tmp_path / "bin"
    plugin.mkdir()
    bin_dir.mkdir()
    (bin_dir / "fi_info").write_text('#!/bin/sh\n[ "$2" = efa ]\n')
    (bin_dir / "fi_info").chmod(0o755)

    def probe(**env: str) -> str:
        done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                              env={"PATH": f"{bin_dir}:/usr/bin:/bin", **env}, check=True)
        return NodeFacts.parse(done.stdout).net

    assert probe() == "socket"
    efa = {"FI_PROVIDER": "efa", "LD_LIBRARY_PATH": f"/nowhere:{plugin}"}
    assert probe(**efa) == "socket:no-libnccl-net.so"
    (plugin / "libnccl-net.so").write_text("")
    assert probe(**efa) == f"ofi:efa:{plugin}"
    assert probe(**{**efa, "FI_PROVIDER": "verbs"}) == "socket:no-verbs-provider"
    # Off the library path but in the linker's cache (/etc/ld.so.conf.d), where NCCL finds it
    # too: before, a false "no libnccl-net.so" warning.
    cached = tmp_path / "multiarch" / "libnccl-net.so"
    (bin_dir / "ldconfig").write_text(
        f"#!/bin/sh\necho '1 libs found in cache'\n"
        f"echo '\tlibnccl-net.so (libc6,x86-64) => {cached}'\n")
    (bin_dir / "ldconfig").chmod(0o755)
    assert probe(FI_PROVIDER="efa") == f"ofi:efa:{cached.parent}"


@pytest.mark.unit
def test_ttl_and_pinned_host_key_in_user_data(profile: Evaluation):
    by_name = {n["name"]: n for n in profile.outputs["nodes"]}
    prefix = f"sortie-{profile.spec.cluster}-host-key-"
    secrets = {r.state["name"].removeprefix(prefix): r
               for r in profile.of_type("aws:secretsmanager/secret:Secret")}
    for name, node in instances(profile).items():
        document = node["userData"]
        assert document.startswith("#cloud-config\n")
        cloud_config = yaml.safe_load(document)
        timer = next(f["content"] for f in cloud_config["write_files"]
                     if f["path"].endswith("sortie-ttl.timer"))
        assert f"OnBootSec={round(profile.spec.ttl_hours * 3600)}s" in timer
        probe = cloud_config["runcmd"][-2][-1]  # the node's Python, found at boot
        assert "/opt/pytorch/bin/python3" in probe and PYTHON_LINK in probe
        assert ["systemctl", "enable", "--now", "sortie-ttl.timer"] in cloud_config["runcmd"]
        # No private key in the user data: the node fetches its own from Secrets Manager.
        assert "PRIVATE KEY" not in document and "ssh_keys" not in cloud_config
        script = next(f["content"] for f in cloud_config["write_files"]
                      if f["path"] == "/opt/sortie/install-host-key.sh")
        assert starts_host_key_fetch(cloud_config)
        secret = secrets[name]
        assert f"get-secret-value --region us-east-1 --secret-id {secret.state['arn']} " in script
        assert by_name[name]["host_key"] in script  # the public half, pinned as it is
        assert cloud_config["ssh_genkeytypes"] == ["ed25519"] and \
            cloud_config["ssh_deletekeys"] is True
        assert "mask --runtime ssh.socket ssh.service" in " ".join(cloud_config["bootcmd"][0]), \
            "sshd waits for the pinned key: never serves the generated one"
        # Nothing is installed before SSH (a p4d node has no internet until its Elastic IP
        # attaches: an apt failure there ended cloud-init, and the key fetch behind it).
        assert "packages" not in cloud_config
        assert list(RSYNC_IF_MISSING) in cloud_config["runcmd"]
    keys = [n["host_key"] for n in profile.outputs["nodes"]]
    assert len(set(keys)) == len(keys), "nodes must not share a host key"
    assert profile.outputs["python"] == PYTHON_LINK


@pytest.mark.unit
def test_each_host_key_is_a_secret_only_its_own_instance_may_read(profile: Evaluation):
    """Anything on a node (IMDS) and anyone who may read instance attributes reads user data:
    the host private key lives in Secrets Manager, one secret per node, and each secret's
    policy refuses every instance but its own."""
    secrets = profile.of_type("aws:secretsmanager/secret:Secret")
    values = {v.state["secretId"]: v.state for v in
              profile.of_type("aws:secretsmanager/secretVersion:SecretVersion")}
    policies = {p.state["secretArn"]: json.loads(p.state["policy"]) for p in
                profile.of_type("aws:secretsmanager/secretPolicy:SecretPolicy")}
    arns = {node["tags"]["sortie-node"]: node["arn"] for node in instances(profile).values()}
    role_arn = profile.only("aws:iam/role:Role").state["arn"]
    assert len(secrets) == len(values) == len(policies) == profile.spec.nodes
    for secret in secrets:
        node = secret.state["name"].removeprefix(f"sortie-{profile.spec.cluster}-host-key-")
        assert secret.state["recoveryWindowInDays"] == 0, "gone with the stack, at once"
        value = values[secret.id]["secretString"]  # a secret: the engine's wrapped form
        assert "OPENSSH PRIVATE KEY" in (value["value"] if isinstance(value, dict) else value)
        (deny,) = policies[secret.state["arn"]]["Statement"]
        assert deny["Effect"] == "Deny" and deny["Action"] == "secretsmanager:GetSecretValue"
        # Only the nodes' role is refused elsewhere (before: every instance-profile caller, a
        # deployer on EC2 included, which could then not refresh the stack).
        assert deny["Condition"] == {"ArnEquals": {"aws:PrincipalArn": role_arn},
                                     "StringNotEquals": {"ec2:SourceInstanceARN": arns[node]}}
    # No node may read any key before every key's policy exists (before: the grant came with
    # the role, and each policy only after its instance).
    (grant,) = [p for p in profile.of_type("aws:iam/rolePolicy:RolePolicy")
                if "secretsmanager" in p.state["policy"]]
    waits_for = {urn for urn in grant.depends_on}
    assert {p.urn for p in profile.of_type("aws:secretsmanager/secretPolicy:SecretPolicy")} \
        <= waits_for
    assert summarize_security(profile).details["host private keys"] == \
        "Secrets Manager, one secret per node, readable only from its own instance"


@pytest.mark.unit
def test_every_taggable_resource_is_tagged(profile: Evaluation):
    taggable = [r for r in profile.resources if sdk_accepts(r.type, "tags")]
    assert len(taggable) >= 12
    for resource in taggable:
        tags = resource.state.get("tags", {})
        assert tags.get(TAG_CLUSTER) == profile.spec.cluster, resource.name
        assert {TAG_RUN, TAG_OWNER, TAG_EXPIRES} <= tags.keys(), resource.name
    kinds = {s["resourceType"] for s in profile.only(TEMPLATE).state["tagSpecifications"]}
    assert kinds == {"instance", "volume", "network-interface"}


@pytest.mark.unit
def test_resources_sit_in_their_subtrees(profile: Evaluation):
    """Teardown keeps the Bucket subtree and recovery replaces a Node's machine: each part
    must hold exactly its own resources."""
    rules = {INGRESS, EGRESS}
    assert subtrees(profile) == {
        "": {"pulumi:providers:aws", "tls:index/privateKey:PrivateKey",
             "aws:ec2/keyPair:KeyPair", "aws:ec2/placementGroup:PlacementGroup", TEMPLATE},
        "Network": {"aws:ec2/vpc:Vpc", "aws:ec2/subnet:Subnet",
                    "aws:ec2/internetGateway:InternetGateway", "aws:ec2/routeTable:RouteTable",
                    "aws:ec2/route:Route",
                    "aws:ec2/routeTableAssociation:RouteTableAssociation",
                    "aws:ec2/securityGroup:SecurityGroup", *rules},
        "Bucket": {"aws:s3/bucket:Bucket", "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock",
                   "aws:s3/bucketServerSideEncryptionConfiguration:"
                   "BucketServerSideEncryptionConfiguration",
                   "aws:s3/bucketVersioning:BucketVersioning",
                   "aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration",
                   "aws:s3/bucketPolicy:BucketPolicy"},
        "NodeAccess": {"aws:iam/role:Role", "aws:iam/rolePolicy:RolePolicy",
                       "aws:iam/instanceProfile:InstanceProfile"},
        "Node": {INSTANCE, "aws:secretsmanager/secret:Secret",
                 "aws:secretsmanager/secretVersion:SecretVersion",
                 "aws:secretsmanager/secretPolicy:SecretPolicy"} |
                ({"aws:ec2/eip:Eip"} if profile.spec.instance.network_cards > 1
                              else set()),
    }
    nodes = node_parts(profile)
    assert sorted(nodes) == [f"{profile.spec.cluster}-node-{i}" for i in range(profile.spec.nodes)]
    assert all(types.count(INSTANCE) == 1 for types in nodes.values())


@pytest.mark.unit
def test_outputs_are_complete_and_build_an_inventory(profile: Evaluation, tmp_path: Path):
    outputs = profile.outputs
    assert outputs["gpus_per_node"] == profile.spec.instance.gpus
    assert outputs["bucket_url"] == "s3://" + profile.only("aws:s3/bucket:Bucket").state["bucket"]
    assert outputs["region"] == "us-east-1" and outputs["ssh_user"] == "ubuntu"
    assert "OPENSSH PRIVATE KEY" in outputs["client_private_key"]
    key_pair = profile.only("aws:ec2/keyPair:KeyPair").state
    inventory = inventory_from_outputs(outputs, tmp_path / "id_ed25519")
    assert [n.name for n in inventory.nodes] == [f"node-{i}" for i in range(profile.spec.nodes)]
    assert inventory.backend == "aws" and inventory.head.port == 22
    assert all(n.gpus == profile.spec.instance.gpus for n in inventory.nodes)
    assert all(n.host_key.startswith("ssh-ed25519 ") for n in inventory.nodes)
    assert inventory.train_env["SORTIE_CHECKPOINT_URL"].startswith(outputs["bucket_url"] + "/")
    assert inventory.train_env["SORTIE_PREEMPTION_NOTICE"] == "aws"  # the trainer polls it
    assert key_pair["publicKey"].split()[0] == "ssh-ed25519"


@pytest.mark.unit
def test_spot_as_configured(profile: Evaluation):
    nodes = instances(profile)
    if profile.spec.spot:  # aws-p3-dev: a single node, so it is spot itself
        options = nodes["node-0"]["instanceMarketOptions"]
        assert options["marketType"] == "spot"
        assert options["spotOptions"] == {"spotInstanceType": "one-time",
                                          "instanceInterruptionBehavior": "terminate"}
    else:
        assert all("instanceMarketOptions" not in n for n in nodes.values())


# -- edge cases --------------------------------------------------------------------------------

@pytest.mark.unit
def test_spot_workers_on_demand_head_with_max_price():
    evaluation = run(nodes=3, spot=True, spotMaxPrice=1.23)
    nodes = instances(evaluation)
    assert "instanceMarketOptions" not in nodes["node-0"]  # the rendezvous store lives here
    for worker in ("node-1", "node-2"):
        spot = nodes[worker]["instanceMarketOptions"]["spotOptions"]
        assert spot["maxPrice"] == "1.2300"  # EC2 wants a string
    assert [n["spot"] for n in evaluation.outputs["nodes"]] == [False, True, True]


@pytest.mark.unit
def test_world_ssh_only_when_explicitly_allowed():
    with pytest.raises(SpecError, match=r"^sortie:sshAllowedCidrs: 0\.0\.0\.0/0 .*allowWorldSsh"):
        run(sshAllowedCidrs=["0.0.0.0/0"])
    opened = run(sshAllowedCidrs=["0.0.0.0/0", "2001:db8::/32"], allowWorldSsh=True)
    cidrs = {r.state.get("cidrIpv4") or r.state.get("cidrIpv6") for r in opened.of_type(INGRESS)}
    assert {"0.0.0.0/0", "2001:db8::/32"} <= cidrs


@pytest.mark.unit
def test_existing_bucket_is_used_not_created():
    evaluation = run(bucketName="team-results")
    assert not evaluation.of_type("aws:s3/bucket:Bucket")
    assert not evaluation.of_type("aws:s3/bucketPolicy:BucketPolicy")
    assert "Bucket" not in subtrees(evaluation)  # nothing of ours to keep or destroy
    resources = {res for policy in evaluation.of_type("aws:iam/rolePolicy:RolePolicy")
                 for statement in json.loads(policy.state["policy"])["Statement"]
                 for res in statement["Resource"]}
    assert resources == {"arn:aws:s3:::team-results", "arn:aws:s3:::team-results/*",
                         "arn:aws:secretsmanager:us-east-1:*:secret:sortie-edge-host-key-*"}
    assert evaluation.outputs["bucket_url"] == "s3://team-results"


@pytest.mark.unit
def test_image_override_and_single_efa_on_p3dn():
    evaluation = run(instanceType="p3dn.24xlarge", image="ami-0123456789abcdef0", zone="us-east-1b")
    template = evaluation.only(TEMPLATE).state
    assert template["imageId"] == "ami-0123456789abcdef0"
    (interface,) = template["networkInterfaces"]
    assert interface["interfaceType"] == "efa" and interface["associatePublicIpAddress"] == "true"
    assert evaluation.only("aws:ec2/subnet:Subnet").state["availabilityZone"] == "us-east-1b"


@pytest.mark.unit
def test_dlami_lookup_matches_the_gpu_generation():
    calls = []

    class Spying(OfflineMocks):
        def call(self, args):
            if args.token == "aws:ec2/getAmi:getAmi":
                calls.append(args.args)
            return super().call(args)

    for instance_type in ("p3.2xlarge", "p4d.24xlarge"):
        evaluate({**BASE, "sortie:instanceType": instance_type}, "ami", mocks=Spying())
    patterns = [next(f["values"][0] for f in c["filters"] if f["name"] == "name") for c in calls]
    # Only the proprietary-driver DLAMI line supports P3 (V100); the OSS line P4 and later.
    assert patterns == [AWS_DLAMI_PROPRIETARY, AWS_DLAMI_OSS]
    assert patterns[0].startswith("Deep Learning Proprietary Nvidia Driver AMI GPU PyTorch")
    assert all(c["owners"] == ["amazon"] and c["mostRecent"] and c["includeDeprecated"] is False
               for c in calls)


@pytest.mark.unit
def test_without_a_zone_the_subnet_goes_where_the_type_is_offered():
    asked = []

    class Offering(OfflineMocks):
        def call(self, args):
            if args.token == "aws:ec2/getInstanceTypeOfferings:getInstanceTypeOfferings":
                asked.append(args.args)
                return {"id": "x", "locations": ["us-east-1f", "us-east-1c", "us-east-1d"]}
            return super().call(args)

    evaluation = evaluate({**BASE, "sortie:instanceType": "p4d.24xlarge"}, "zoned",
                          mocks=Offering())
    subnet = evaluation.only("aws:ec2/subnet:Subnet").state
    assert subnet["availabilityZone"] == "us-east-1c", "the first offering zone, by name"
    assert evaluation.outputs["zone"] == "us-east-1c"
    [question] = asked
    assert question["locationType"] == "availability-zone" and \
        question["filters"] == [{"name": "instance-type", "values": ["p4d.24xlarge"]}]
    assert question["region"] == "us-east-1"
    asked.clear()
    run(zone="us-east-1b")
    assert asked == [], "a profile's zone is used as it is"


@pytest.mark.unit
def test_no_zone_offering_the_type_is_one_line_naming_the_region():
    from sortie.infra.aws.program import first_offering_zone

    with pytest.raises(SpecError, match=r"^sortie:region: no zone of us-east-1 offers "
                                        r"p4d.24xlarge"):
        first_offering_zone(run().spec.model_copy(update={"instance_type": "p4d.24xlarge"}),
                            [])


@pytest.mark.unit
def test_a_newer_image_on_a_later_up_replaces_no_healthy_node():
    """A recovery runs the program again; by then the AMI lookup may find a newer DLAMI. The
    template gets a new version, but no node's arguments change (`launch_template` would force
    its replacement), so Pulumi leaves every healthy node, the head included, where it is."""

    class NewerImage(OfflineMocks):
        def call(self, args):
            answer, failures = super().call(args)
            if args.token == "aws:ec2/getAmi:getAmi":
                answer["id"] = "ami-0newer00000000000"
            return answer, failures

    # The expiry pinned: counted from now, it differs between two runs a minute apart (as a
    # later `up` keeps the stack's own, from its config).
    config = {**BASE, "sortie:instanceType": "p4d.24xlarge", "sortie:nodes": 2,
              "sortie:expiresAt": "2099-01-01T00:00:00Z"}
    first, later = evaluate(config, "again"), evaluate(config, "again", mocks=NewerImage())
    assert first.only(TEMPLATE).state["imageId"] != later.only(TEMPLATE).state["imageId"]

    def node_arguments(evaluation: Evaluation) -> dict[str, dict]:
        # The user data holds each node's host key, kept in the stack's state between `up`s
        # (the mocks make new ones each run), so it is left out here.
        return {name: {k: v for k, v in node.items() if k not in ("userData",)}
                for name, node in instances(evaluation).items()}

    assert node_arguments(first) == node_arguments(later)


@pytest.mark.unit
def test_a_long_cluster_name_fits_the_bucket_prefix():
    name = "a" * 40
    evaluation = evaluate({**BASE, "sortie:cluster": name}, "long")
    prefix = evaluation.only("aws:s3/bucket:Bucket").state["bucketPrefix"]
    assert len(prefix) <= 37 and prefix.startswith("sortie-aaaa") and prefix.endswith("-")
    other = evaluate({**BASE, "sortie:cluster": "a" * 39 + "b"}, "long")
    assert other.only("aws:s3/bucket:Bucket").state["bucketPrefix"] != prefix
    assert run().only("aws:s3/bucket:Bucket").state["bucketPrefix"] == "sortie-edge-"


# -- bad profiles: one line naming the key, before any resource is declared ----------------------

@pytest.mark.parametrize(("settings", "key"), [
    ({"instanceType": "p9.mega"}, "sortie:instanceType"),
    ({"instanceType": "a2-highgpu-8g"}, "sortie:instanceType"),  # a GCP type on AWS
    ({"nodes": 0}, "sortie:nodes"),
    ({"nodes": "two"}, "sortie:nodes"),
    ({"sshAllowedCidrs": ["10.0.0.300/32"]}, "sortie:sshAllowedCidrs"),
    ({"sshAllowedCidrs": ["10.1.2.3/8"]}, "sortie:sshAllowedCidrs"),  # host bits set
    ({"sshAllowedCidrs": []}, "sortie:sshAllowedCidrs"),
    ({"spotMaxPrice": -2}, "sortie:spotMaxPrice"),
    ({"region": "af-south-1", "instanceType": "p4d.24xlarge"}, "sortie:region"),
    ({"zone": "eu-west-1a"}, "sortie:zone"),
    ({"cloud": "oracle"}, "sortie:cloud"),
    ({"ttlHours": 0}, "sortie:ttlHours"),
    ({"instancetype": "p3.2xlarge"}, "sortie:instancetype"),  # a typo'd key
])
@pytest.mark.unit
def test_bad_profile_one_line_naming_the_key(settings, key):
    with pytest.raises(SpecError) as error:
        run(**settings)
    message = str(error.value)
    assert message.startswith(key + ":") and "\n" not in message


@pytest.mark.unit
def test_missing_required_key_is_named():
    config = {k: v for k, v in BASE.items() if k != "sortie:sshAllowedCidrs"}
    with pytest.raises(SpecError, match=r"^sortie:sshAllowedCidrs: required"):
        evaluate(config, "edge")


@pytest.mark.unit
def test_program_entry_point_refuses_bad_profile_before_declaring_anything():
    """`pulumi up` runs infra/__main__.py: a bad key stops it with RunError, nothing declared."""
    monitor = RecordingMonitor(OfflineMocks())
    pulumi.runtime.set_mocks(monitor.mocks, project="sortie", stack="bad", monitor=monitor,
                             preview=False)
    pulumi.runtime.set_all_config(config_strings({**BASE, "sortie:nodes": 0}))
    with pytest.raises(pulumi.RunError, match=r"^sortie:nodes: "):
        runpy.run_module("sortie.infra.__main__", run_name="__main__")
    assert monitor.resources == {}


@pytest.mark.unit
def test_program_entry_point_declares_the_cluster():
    monitor = RecordingMonitor(OfflineMocks())
    pulumi.runtime.set_mocks(monitor.mocks, project="sortie", stack="main", monitor=monitor,
                             preview=False)
    pulumi.runtime.set_all_config(config_strings(BASE))

    @pulumi.runtime.test
    def program():
        runpy.run_module("sortie.infra.__main__", run_name="__main__")

    program()
    assert len(monitor.declared()) >= 25
    assert any(r.type == "sortie:aws:GpuCluster" for r in monitor.declared())


@pytest.mark.unit
def test_every_tagged_resource_carries_the_sortie_id():
    """Teardown sweeps by this id (issue 28, item 5): two sorties named `exp` in one account
    never see each other's resources."""
    evaluation = run(sortieId="exp-0a1b2c3d")
    tagged = [r.state["tags"] for r in evaluation.resources
              if isinstance(r.state.get("tags"), dict)]
    assert len(tagged) > 10 and all(t["sortie-id"] == "exp-0a1b2c3d" for t in tagged)
    assert evaluate_with(BASE).spec.sweep_tag == ("sortie-cluster", "edge")


@pytest.mark.unit
def test_idle_stop_timer_only_when_held_with_idle_stop():
    """`sortie up --idle-stop 30m`: every node checks each minute and powers itself off once no
    login user's process has run for 30 minutes; without it, no such timer."""
    for name, node in instances(run(idleStopMinutes=30, nodes=2)).items():
        cloud_config = yaml.safe_load(node["userData"])
        files = {f["path"]: f["content"] for f in cloud_config["write_files"]}
        assert "OnUnitActiveSec=60s" in files["/etc/systemd/system/sortie-idle-stop.timer"]
        assert "-ge 1800 ]" in files["/opt/sortie/idle-stop.sh"], name
        assert ["systemctl", "enable", "--now", "sortie-idle-stop.timer"] in \
            cloud_config["runcmd"]
    for node in instances(run()).values():
        assert "sortie-idle-stop" not in node["userData"]
