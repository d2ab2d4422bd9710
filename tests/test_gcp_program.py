"""The GCP program, run for real under Pulumi's mock runtime: the AWS invariants in GCP terms."""

from __future__ import annotations

import ipaddress
import json
import re
from pathlib import Path

import pytest
import yaml

from sortie.infra.cloud_init import HOST_KEY_SCRIPT, PYTHON_LINK
from sortie.infra.gcp.program import GPU_NIC_RANGE
from sortie.infra.gcp.review import security_summary as gcp_security_summary
from sortie.infra.review import Evaluation
from sortie.infra.spec import TAG_CLUSTER, TAG_EXPIRES, TAG_OWNER, TAG_RUN, SpecError
from sortie.stacks.cloud.outputs import inventory_from_outputs
from tests.helpers import (
    evaluate,
    evaluate_profile,
    evaluate_with,
    node_parts,
    sdk_accepts,
    starts_host_key_fetch,
    subtrees,
)

pytestmark = pytest.mark.unit

FIREWALL = "gcp:compute/firewall:Firewall"
INSTANCE = "gcp:compute/instance:Instance"
BUCKET = "gcp:storage/bucket:Bucket"
ACCOUNT = "gcp:serviceaccount/account:Account"
SECRET = "gcp:secretmanager/secret:Secret"
SECRET_READER = "gcp:secretmanager/secretIamMember:SecretIamMember"
BASE = {"sortie:cloud": "gcp", "sortie:region": "us-central1",
        "sortie:instanceType": "a2-highgpu-1g", "sortie:sshAllowedCidrs": ["198.51.100.7/32"]}
SPOT_SCHEDULING = {"provisioningModel": "SPOT", "preemptible": True, "automaticRestart": False,
                   "onHostMaintenance": "TERMINATE", "instanceTerminationAction": "DELETE"}


def run(**settings) -> Evaluation:
    return evaluate_with(BASE, **settings)


def instances(evaluation: Evaluation) -> dict[str, dict]:
    return {r.state["labels"]["sortie-node"]: r.state for r in evaluation.of_type(INSTANCE)}


@pytest.fixture(scope="module", params=["gcp-a2-dev", "gcp-a2", "gcp-a3-mega"])
def profile(request) -> Evaluation:
    return evaluate_profile(request.param)


def test_ssh_only_from_allowed_cidrs_to_cluster_nodes(profile: Evaluation):
    tag = f"sortie-{profile.spec.cluster}"
    every = [r.state for r in profile.of_type(FIREWALL)]
    assert all(rule["direction"] == "INGRESS" for rule in every)
    # A3's GPU NIC networks: traffic from the cluster's GPU NIC subnets only
    gpu_nets = [rule for rule in every if rule.get("sourceRanges") == [GPU_NIC_RANGE]]
    assert len(gpu_nets) == profile.spec.instance.network_cards
    rules = [rule for rule in every if rule not in gpu_nets]
    assert all(rule["targetTags"] == [tag] for rule in rules)
    with_ranges = [rule for rule in rules if rule.get("sourceRanges")]
    assert len(with_ranges) == 1  # the SSH rule; nothing else takes outside traffic
    (ssh,) = with_ranges
    assert ssh["allows"] == [{"protocol": "tcp", "ports": ["22"]}]
    assert set(ssh["sourceRanges"]) == set(profile.spec.ssh_allowed_cidrs)
    assert all(ipaddress.ip_network(c).prefixlen > 0 for c in ssh["sourceRanges"])
    assert not any("denies" in rule for rule in rules)


def test_all_traffic_among_nodes_by_network_tag(profile: Evaluation):
    tag = f"sortie-{profile.spec.cluster}"
    (internal,) = [r.state for r in profile.of_type(FIREWALL) if r.state.get("sourceTags")]
    assert internal["sourceTags"] == [tag] and internal["targetTags"] == [tag]
    assert internal["allows"] == [{"protocol": "all"}]
    assert all(node["tags"] == [tag] for node in instances(profile).values())


def test_resources_sit_in_their_subtrees(profile: Evaluation):
    """Teardown keeps the Bucket subtree (never the nodes' grant on it) and recovery replaces a
    Node's machine: each part must hold exactly its own resources."""
    placement = {"gcp:compute/resourcePolicy:ResourcePolicy"} if profile.spec.nodes > 1 else set()
    assert subtrees(profile) == {
        "": {"pulumi:providers:gcp", "tls:index/privateKey:PrivateKey", *placement},
        "Network": {"gcp:compute/network:Network", "gcp:compute/subnetwork:Subnetwork", FIREWALL},
        "Bucket": {BUCKET},
        "NodeAccess": {"gcp:serviceaccount/account:Account",
                       "gcp:storage/bucketIAMMember:BucketIAMMember"},
        "Node": {INSTANCE, SECRET, "gcp:secretmanager/secretVersion:SecretVersion",
                 SECRET_READER},
    }
    nodes = node_parts(profile)
    assert sorted(nodes) == [f"{profile.spec.cluster}-node-{i}" for i in range(profile.spec.nodes)]
    assert all(sorted(types) == sorted([INSTANCE, SECRET, SECRET_READER,
                                        "gcp:secretmanager/secretVersion:SecretVersion"])
               for types in nodes.values())


def test_custom_mode_network(profile: Evaluation):
    networks = profile.of_type("gcp:compute/network:Network")
    assert all(n.state["autoCreateSubnetworks"] is False for n in networks)
    subnets = profile.of_type("gcp:compute/subnetwork:Subnetwork")
    assert len(networks) == len(subnets) == 1 + profile.spec.instance.network_cards
    assert {s.state["region"] for s in subnets} == {profile.spec.region}


def test_bucket_private_uniform_versioned_expiring(profile: Evaluation):
    bucket = profile.only(BUCKET).state
    assert bucket["uniformBucketLevelAccess"] is True
    assert bucket["publicAccessPrevention"] == "enforced"
    assert bucket["versioning"] == {"enabled": True}
    ages = [rule["condition"] for rule in bucket["lifecycleRules"]
            if rule["action"]["type"] == "Delete"]
    assert {"age": profile.spec.bucket_expiry_days} in ages


def test_each_node_has_an_account_of_its_own_reaching_only_this_bucket(profile: Evaluation):
    accounts = {a.state["member"]: a.state for a in profile.of_type(ACCOUNT)}
    grants = profile.of_type("gcp:storage/bucketIAMMember:BucketIAMMember")
    assert len(accounts) == len(grants) == profile.spec.nodes
    for grant in grants:
        assert grant.state["bucket"] == profile.only(BUCKET).state["name"]
        assert grant.state["member"] in accounts
        assert grant.state["role"] == "roles/storage.objectAdmin"
    assert {g.state["member"] for g in grants} == set(accounts)
    iam_types = {r.type for r in profile.resources if "iam" in r.type.lower()}
    assert iam_types == {"gcp:storage/bucketIAMMember:BucketIAMMember", SECRET_READER}, \
        "no wider grants"
    emails = [node["serviceAccount"]["email"] for node in instances(profile).values()]
    assert sorted(emails) == sorted(a["email"] for a in accounts.values()), "one each"


def test_each_host_key_is_a_secret_only_its_own_node_may_read(profile: Evaluation):
    """Before: the host private key sat in the user-data metadata, readable by any process on
    the node and anyone who may read the instance. Now a secret per node, readable by that
    node's own service account alone; the metadata holds the public half and how to fetch it."""
    secrets = {s.state["labels"]["sortie-node"]: s for s in profile.of_type(SECRET)}
    values = {v.state["secret"]: v.state for v in
              profile.of_type("gcp:secretmanager/secretVersion:SecretVersion")}
    readers = {r.state["secretId"]: r.state for r in profile.of_type(SECRET_READER)}
    assert len(secrets) == len(values) == len(readers) == profile.spec.nodes
    keys = {r.name: r.state for r in profile.of_type("tls:index/privateKey:PrivateKey")}
    by_name = {n["name"]: n for n in profile.outputs["nodes"]}
    for name, node in instances(profile).items():
        secret = secrets[name].state
        assert secret["secretId"] == f"sortie-{profile.spec.cluster}-host-key-{name}"
        assert secret["replication"] == {"auto": {}}
        assert secret.get("deletionProtection") is not True, "gone with the stack"
        value = values[secrets[name].id]["secretData"]["value"]  # the engine's wrapped secret
        host_key = next(k for k in keys.values()
                        if k["publicKeyOpenssh"].strip() == by_name[name]["host_key"])
        assert value == host_key["privateKeyOpenssh"]
        reader = readers[secret["secretId"]]
        assert reader["role"] == "roles/secretmanager.secretAccessor"
        assert reader["member"] == f"serviceAccount:{node['serviceAccount']['email']}"
        user_data = node["metadata"]["user-data"]
        assert "PRIVATE KEY" not in user_data
        cloud_config = yaml.safe_load(user_data)
        assert "ssh_keys" not in cloud_config
        script = next(f["content"] for f in cloud_config["write_files"]
                      if f["path"] == HOST_KEY_SCRIPT)
        # The standard library's fetcher, not gcloud (which root's PATH may lack).
        assert (f"python3 /opt/sortie/gcp_host_key.py {secret['project']} "
                f"{secret['secretId']}") in script
        fetcher = next(f["content"] for f in cloud_config["write_files"]
                       if f["path"] == "/opt/sortie/gcp_host_key.py")
        assert "metadata.google.internal/computeMetadata/v1/instance/" in fetcher
        assert by_name[name]["host_key"] in script  # the public half, pinned as it is
        assert starts_host_key_fetch(cloud_config)
    summary = gcp_security_summary(profile)
    assert summary.details["host private keys"] == (
        "Secret Manager, one secret per node, readable only by its node's own account")
    assert "each its own host key" in summary.details["node accounts reach"]


def test_the_summary_says_so_when_a_node_may_read_another_nodes_key():
    """The read-back is of what the program declared: a grant to the wrong node shows."""
    from dataclasses import replace

    evaluation = run(nodes=2)
    readers = evaluation.of_type(SECRET_READER)
    wrong = replace(readers[0], state={**readers[0].state, "member": readers[1].state["member"]})
    altered = replace(evaluation, resources=[wrong if r is readers[0] else r
                                             for r in evaluation.resources])
    assert gcp_security_summary(altered).details["host private keys"] == (
        "Secret Manager, NOT limited to each node's own account")


def test_scheduling_spot_and_ttl(profile: Evaluation):
    ttl_s = round(profile.spec.ttl_hours * 3600)
    for index, (name, node) in enumerate(sorted(instances(profile).items())):
        scheduling = node["scheduling"]
        assert scheduling["maxRunDuration"] == {"seconds": ttl_s}
        assert scheduling["instanceTerminationAction"] == "DELETE"
        assert scheduling["onHostMaintenance"] == "TERMINATE"  # GPUs cannot live-migrate
        if profile.spec.is_spot(index):
            assert {k: scheduling[k] for k in SPOT_SCHEDULING} == SPOT_SCHEDULING, name
        else:
            assert scheduling["provisioningModel"] == "STANDARD"
            assert scheduling["preemptible"] is False
    assert profile.spec.spot == any(n["spot"] for n in profile.outputs["nodes"])


def test_nodes_gvnic_a2_image_keys_and_ttl(profile: Evaluation):
    by_name = {n["name"]: n for n in profile.outputs["nodes"]}
    (client,) = [r.state for r in profile.of_type("tls:index/privateKey:PrivateKey")
                 if r.name.endswith("-client-key")]
    for name, node in instances(profile).items():
        assert node["machineType"] == profile.spec.instance_type
        assert "guestAccelerators" not in node  # A2 machine types carry their GPUs
        nic, *gpu_nics = node["networkInterfaces"]
        assert nic["nicType"] == "GVNIC" and nic["accessConfigs"]
        # A3: its GPU NICs, gVNIC, no public address
        assert len(gpu_nics) == profile.spec.instance.network_cards
        assert all(g["nicType"] == "GVNIC" and not g.get("accessConfigs") for g in gpu_nics)
        params = node["bootDisk"]["initializeParams"]
        assert "deeplearning-platform-release" in params["image"]
        metadata = node["metadata"]
        assert metadata["block-project-ssh-keys"] == "TRUE"
        user, key = metadata["ssh-keys"].split(":", 1)
        assert user == "sortie" and key.split()[:2] == client["publicKeyOpenssh"].split()
        cloud_config = yaml.safe_load(metadata["user-data"])
        assert by_name[name]["host_key"] in metadata["user-data"]
        timer = next(f["content"] for f in cloud_config["write_files"]
                     if f["path"].endswith("sortie-ttl.timer"))
        # The in-guest timer only stops a VM, and a stop clears the cloud's own deadline: it
        # must fire after that deadline, as a backstop (10 minutes after).
        deadline_s = node["scheduling"]["maxRunDuration"]["seconds"]
        assert f"OnBootSec={round(profile.spec.ttl_hours * 3600) + 600}s" in timer
        assert (round(profile.spec.ttl_hours * 60) + 10) * 60 > deadline_s
        probe = cloud_config["runcmd"][-2][-1]
        assert "/opt/conda/bin/python3" in probe and PYTHON_LINK in probe
        assert profile.outputs["python"] == PYTHON_LINK
        agent = next(f["content"] for f in cloud_config["write_files"]
                     if f["path"] == "/etc/default/instance_configs.cfg")
        assert "set_host_keys = false" in agent  # the guest agent must not replace the key


def test_compact_placement_when_the_count_allows(profile: Evaluation):
    policies = profile.of_type("gcp:compute/resourcePolicy:ResourcePolicy")
    if profile.spec.nodes == 1:
        assert not policies
        assert all("resourcePolicies" not in n for n in instances(profile).values())
        return
    (policy,) = policies
    # No vmCount: with one, exactly that many instances must be created together, and a
    # recovery's one replacement would be refused.
    assert policy.state["groupPlacementPolicy"] == {"collocation": "COLLOCATED"}
    assert all(n["resourcePolicies"] == policy.state["selfLink"]  # a single string
               for n in instances(profile).values())


def test_labels_on_everything_that_takes_them(profile: Evaluation):
    labelled = [r for r in profile.resources if sdk_accepts(r.type, "labels")]
    assert {r.type for r in labelled} >= {INSTANCE, BUCKET}
    for resource in labelled:
        labels = resource.state["labels"]
        assert labels[TAG_CLUSTER] == profile.spec.cluster, resource.name
        assert {TAG_RUN, TAG_OWNER, TAG_EXPIRES} <= labels.keys()
        assert all(v == v.lower() and ":" not in v for v in labels.values())
    for node in instances(profile).values():
        assert node["bootDisk"]["initializeParams"]["labels"][TAG_CLUSTER] == profile.spec.cluster


def test_outputs_build_an_inventory(profile: Evaluation, tmp_path: Path):
    outputs = profile.outputs
    assert outputs["cloud"] == "gcp" and outputs["zone"].startswith(f"{profile.spec.region}-")
    assert outputs["bucket_url"] == "gs://" + profile.only(BUCKET).state["name"]
    inventory = inventory_from_outputs(outputs, tmp_path / "key")
    assert inventory.backend == "gcp" and inventory.head.user == "sortie"
    assert len(inventory.nodes) == profile.spec.nodes
    assert all(n.gpus == profile.spec.instance.gpus for n in inventory.nodes)
    addresses = {n.address for n in inventory.nodes} | {n.private_address
                                                         for n in inventory.nodes}
    assert len(addresses) == 2 * profile.spec.nodes


def test_spot_workers_keep_an_on_demand_head_and_ipv6_gets_its_own_rule():
    evaluation = run(nodes=3, spot=True, sshAllowedCidrs=["198.51.100.0/24", "2001:db8::/48"])
    nodes = instances(evaluation)
    assert nodes["node-0"]["scheduling"]["provisioningModel"] == "STANDARD"
    assert nodes["node-2"]["scheduling"]["provisioningModel"] == "SPOT"
    ranges = sorted(tuple(r.state["sourceRanges"]) for r in evaluation.of_type(FIREWALL)
                    if r.state.get("sourceRanges"))
    assert ranges == [("198.51.100.0/24",), ("2001:db8::/48",)]


def test_existing_bucket_and_large_cluster_without_placement():
    evaluation = run(bucketName="team-results", nodes=30)
    assert not evaluation.of_type(BUCKET) and "Bucket" not in subtrees(evaluation)
    grants = evaluation.of_type("gcp:storage/bucketIAMMember:BucketIAMMember")
    assert len(grants) == 30 and {g.state["bucket"] for g in grants} == {"team-results"}
    assert not evaluation.of_type("gcp:compute/resourcePolicy:ResourcePolicy")
    assert evaluation.outputs["bucket_url"] == "gs://team-results"


@pytest.mark.parametrize(("settings", "key"), [
    ({"instanceType": "p4d.24xlarge"}, "sortie:instanceType"),
    ({"region": "us-east1", "instanceType": "a2-ultragpu-8g"}, "sortie:region"),
    ({"zone": "us-central1-z"}, "sortie:zone"),
    ({"nodes": 0}, "sortie:nodes"),
    ({"sshAllowedCidrs": ["::/0"]}, "sortie:sshAllowedCidrs"),
    ({"spotMaxPrice": -0.5}, "sortie:spotMaxPrice"),
])
def test_bad_gcp_profile_one_line_naming_the_key(settings, key):
    with pytest.raises(SpecError) as error:
        run(**settings)
    assert str(error.value).startswith(key + ":") and "\n" not in str(error.value)


def test_project_is_gcp_only():
    assert run(project="my-project").spec.project == "my-project"
    with pytest.raises(SpecError, match="^sortie:project: "):
        evaluate_with({**BASE, "sortie:cloud": "aws", "sortie:region": "us-east-1",
                       "sortie:instanceType": "p3.2xlarge"}, project="my-project")


def test_what_takes_no_labels_is_named_as_the_tag_sweep_looks_for_it(profile: Evaluation):
    """Networks, subnetworks, firewall rules, placement policies and service accounts carry no
    GCP labels: the sweep (infra/gcp/home.py) finds them by the names the program gives them."""
    import re

    from sortie.infra.gcp.facts import node_account_id
    from sortie.infra.gcp.home import GCP_LOGICAL_NAMES

    cluster = profile.spec.cluster
    unlabelled = [r for r in profile.resources if r.type in (
        "gcp:compute/network:Network", "gcp:compute/subnetwork:Subnetwork", FIREWALL,
        "gcp:compute/resourcePolicy:ResourcePolicy")]
    assert len(unlabelled) >= 4
    for resource in unlabelled:  # Pulumi appends "-<random hex>" to each of these names
        assert re.fullmatch(rf"{re.escape(cluster)}-{GCP_LOGICAL_NAMES}", resource.name), \
            resource.name
    accounts = sorted(a.state["accountId"] for a in profile.of_type(ACCOUNT))
    assert accounts == sorted(node_account_id(cluster, i) for i in range(profile.spec.nodes))
    labelled = [r for r in profile.resources if r.type in (INSTANCE, BUCKET)]
    assert labelled and all(r.state["labels"][TAG_CLUSTER] == cluster for r in labelled)


def test_service_account_ids_are_unique_per_cluster():
    """Before: ids were the name cut to 30 characters, so `experiment-lr-sweep-0001` and `-0002`
    shared an account: the second launch failed and its sweep listed the first's account."""
    import re

    from sortie.infra.gcp.facts import node_account_id

    names = ["experiment-lr-sweep-0001", "experiment-lr-sweep-0002", "a", "x" * 40,
             "ends-with-dash-at-16-x"]
    ids = [node_account_id(name, index) for name in names for index in (0, 1, 511)]
    assert len(set(ids)) == len(ids)
    for account in ids:
        assert re.fullmatch(r"[a-z]([-a-z0-9]{4,28}[a-z0-9])", account), account
    first, second = run(cluster=names[0]), run(cluster=names[1])
    declared = {e.only(ACCOUNT).state["accountId"] for e in (first, second)}
    assert declared == {ids[0], ids[3]}


def test_what_takes_no_labels_names_its_sortie_in_its_description():
    """The sweep finds the network, subnetwork, firewall rules, placement policy and node
    accounts by name and then by this, so two sorties of one name never sweep each other's."""
    evaluation = run(nodes=2, sortieId="exp-0a1b2c3d")
    kinds = ("gcp:compute/network:Network", "gcp:compute/subnetwork:Subnetwork",
             "gcp:compute/firewall:Firewall", "gcp:compute/resourcePolicy:ResourcePolicy",
             "gcp:serviceaccount/account:Account")
    described = [r for kind in kinds for r in evaluation.of_type(kind)]
    assert len(described) >= 7
    assert all("sortie-id=exp-0a1b2c3d" in r.state["description"] for r in described)
    labelled = [r.state["labels"] for r in evaluation.resources
                if isinstance(r.state.get("labels"), dict) and r.state["labels"]]
    assert labelled and all(labels["sortie-id"] == "exp-0a1b2c3d" for labels in labelled)


def test_idle_stop_timer_when_held_with_idle_stop():
    for node in instances(run(idleStopMinutes=45)).values():
        cloud_config = yaml.safe_load(node["metadata"]["user-data"])
        assert ["systemctl", "enable", "--now", "sortie-idle-stop.timer"] in \
            cloud_config["runcmd"]
        script = next(f["content"] for f in cloud_config["write_files"]
                      if f["path"] == "/opt/sortie/idle-stop.sh")
        assert "-ge 2700 ]" in script


def test_a_launch_without_a_zone_tries_each_zone_the_catalog_offers_in_turn():
    """GCP tried one zone (the program's first pick) and then on-demand; it now walks the
    catalog's zones for the type as AWS walks the zones its API offers (issue 64)."""
    from sortie.infra.cloud_home import home
    from sortie.stacks.cloud.sites import Site
    from sortie.stacks.cloud.stack_api import spec_from_config

    config = {**BASE, "sortie:spot": True, "sortie:spotFallbackOnDemand": True}
    site = Site("gcp-test", config, spec_from_config("gcp-test", config))
    offered = home("gcp").offered_zones(site.spec)
    assert offered == ["us-central1-a", "us-central1-b", "us-central1-c", "us-central1-f"]
    assert [p.describe() for p in site.placements(offered)] == [
        *(f"zone {zone}" for zone in offered), "zone us-central1-a, on-demand"]
    pinned = site.setting("zone", "us-central1-c")
    assert [p.zone for p in pinned.placements(offered)] == ["us-central1-c", "us-central1-c"]


def masked(inputs: dict) -> str:
    """A resource's inputs with the keys the mocks make anew each run masked (in a stack they
    are its state, the same at every `up`)."""
    return re.sub(r"(ssh-ed25519|BEGIN OPENSSH PRIVATE KEY-----)[^'\"\s]*\s*[A-Za-z0-9+/=]*",
                  "KEY", json.dumps(inputs, sort_keys=True))


def test_a_second_pulumi_up_of_an_init_project_replaces_nothing(tmp_path, monkeypatch):
    """Issue 64: `sortie init` then `pulumi up` twice replaced every GCP VM: the program
    computed the expiry anew at each run and the boot disk took it as a create-only label.
    `init` now pins `sortie:expiresAt`, and the disk keeps only labels that never change."""
    import datetime as real

    from sortie.infra import spec as spec_module
    from sortie.stacks.cloud.project import write_project

    write_project(tmp_path, "gcp-a2")
    config = yaml.safe_load((tmp_path / "Pulumi.gcp-a2.yaml").read_text())["config"]

    class Later(real.datetime):
        @classmethod
        def now(cls, tz=None):
            return real.datetime.now(tz) + real.timedelta(hours=3)

    first = evaluate(config, "gcp-a2")
    monkeypatch.setattr(spec_module, "datetime", Later)  # the second `up`, hours later
    second = evaluate(config, "gcp-a2")
    assert {r.urn: masked(r.inputs) for r in first.resources} == \
        {r.urn: masked(r.inputs) for r in second.resources}

    # Without the pin (a project written by hand) the expiry moves, but only where an update
    # takes it in place: each instance's create-only boot disk is the same.
    unpinned = {key: value for key, value in config.items() if key != "sortie:expiresAt"}
    monkeypatch.setattr(spec_module, "datetime", real.datetime)
    before = instances(evaluate(unpinned, "gcp-a2"))
    monkeypatch.setattr(spec_module, "datetime", Later)
    after = instances(evaluate(unpinned, "gcp-a2"))
    assert before["node-0"]["labels"][TAG_EXPIRES] != after["node-0"]["labels"][TAG_EXPIRES]
    assert all(before[n]["bootDisk"] == after[n]["bootDisk"] for n in before)
    assert TAG_EXPIRES not in before["node-0"]["bootDisk"]["initializeParams"]["labels"]


def test_the_network_takes_jumbo_frames(profile: Evaluation):
    """Issue 64: the VPC's default MTU (1460) cut NCCL's TCP traffic between A2 nodes into
    small segments; Google's GPU network guides set 8896, the most a VPC takes."""
    networks = profile.of_type("gcp:compute/network:Network")  # (in no promised order)
    (network,) = [r.state for r in networks if r.name == f"{profile.spec.cluster}-network"]
    assert network["mtu"] == 8896 and network["autoCreateSubnetworks"] is False
    # A3's GPU NIC networks: the MTU Google's GPUDirect guide gives them
    gpu_networks = [r.state for r in networks if "-gpu-net-" in r.name]
    assert [n["mtu"] for n in gpu_networks] == [8244] * profile.spec.instance.network_cards
