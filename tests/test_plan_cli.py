"""`sortie plan`: the real program, offline, from a clean environment with no cloud credentials."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

CLOUD_ENV = ("AWS_", "GOOGLE_", "CLOUDSDK_", "AZURE_", "ARM_", "PULUMI_")


def plan(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """`sortie plan` in a child process whose environment has no cloud credentials or Pulumi."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(CLOUD_ENV)}
    env["HOME"] = str(cwd)  # no ~/.aws, ~/.config/gcloud, ~/.azure, ~/.pulumi either
    return subprocess.run([sys.executable, "-m", "sortie", "plan", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def test_plan_aws_p4d_offline(tmp_path: Path):
    result = plan("--stack", "aws-p4d", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "sortie:aws:GpuCluster" in out and "aws:ec2/instance:Instance" in out
    assert "SSH (22) reachable from" in out and "198.51.100.7/32" in out
    assert "43.92" in out  # 2 × p4d.24xlarge on-demand $/h (AWS's price list of 2026-07-20)
    assert "image: Deep Learning OSS Nvidia Driver AMI GPU PyTorch" in out
    assert "175.66" in out  # … for the 4 h TTL
    assert not list(tmp_path.iterdir()), "a plan must not write anything"


def test_plan_json_is_machine_readable(tmp_path: Path):
    result = plan("--stack", "aws-p3-dev", "--json", "--set", "nodes=3", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["nodes"] == 3 and document["instance_type"] == "p3.2xlarge"
    instances = [r for r in document["resources"] if r["type"] == "aws:ec2/instance:Instance"]
    assert len(instances) == 3
    security = document["security"]
    assert security["ssh_from"] == ["198.51.100.7/32"] and security["world_ssh"] is False
    assert security["bucket_public"] is False and security["bucket_tls_only"] is True
    cost = document["cost"]
    assert cost["on_demand_usd_h"] == pytest.approx(3 * 3.06)
    assert cost["spot_usd_h"] == pytest.approx(3.06 + 2 * 0.92)  # the head stays on-demand
    assert cost["spot_ttl_usd"] == pytest.approx(round((3.06 + 2 * 0.92) * 2, 2))
    assert "client_private_key" not in document["outputs"]
    assert "PRIVATE KEY" not in result.stdout
    # The image line that has a V100 driver (before: the OSS line, which lists no P3).
    assert document["image"].startswith("Deep Learning Proprietary Nvidia Driver AMI GPU")
    assert "proprietary NVIDIA driver line" in document["image_line"]


@pytest.mark.parametrize(("args", "field"), [
    (["--stack", "no-such-profile"], "--stack"),
    (["--stack", "aws-p4d", "--set", "nodes=0"], "sortie:nodes"),
    (["--stack", "aws-p4d", "--set", "instanceType=p9.mega"], "sortie:instanceType"),
    (["--stack", "aws-p4d", "--set", "sshAllowedCidrs=[300.1.1.1/32]"], "sortie:sshAllowedCidrs"),
    (["--stack", "aws-p4d", "--set", "sshAllowedCidrs=[0.0.0.0/0]"], "sortie:sshAllowedCidrs"),
    (["--stack", "aws-p4d", "--set", "spotMaxPrice=-2"], "sortie:spotMaxPrice"),
    (["--stack", "aws-p4d", "--set", "region=sa-east-1"], "sortie:region"),
    (["--stack", "aws-p4d", "--set", "nodes"], "--set"),
    # Before: silently ignored (a key outside the sortie: namespace) or accepted.
    (["--stack", "aws-p4d", "--set", "aws:region=eu-west-1"], "--set aws:region"),
    (["--stack", "aws-p4d", "--set", "zone=us-east-1z"], "sortie:zone"),
    (["--stack", "aws-p4d", "--set", "fallbackZones=[us-east-1q]"], "sortie:fallbackZones"),
    # Before: only /0 was refused; these two halves are the whole internet.
    (["--stack", "aws-p4d", "--set", "sshAllowedCidrs=[0.0.0.0/1,128.0.0.0/1]"],
     "sortie:sshAllowedCidrs"),
    (["--stack", "aws-p4d", "--set", "sshAllowedCidrs=[10.0.0.0/7]"], "sortie:sshAllowedCidrs"),
    (["--stack", "gcp-a2", "--set", "sshAllowedCidrs=[2001:db8::/31]"], "sortie:sshAllowedCidrs"),
    (["--stack", "azure-nd96", "--set", "ttlHours=30"], "sortie:ttlHours"),
    ([], "--stack"),
])
def test_bad_plan_input_is_one_line_exit_2(args, field, tmp_path: Path):
    result = plan(*args, cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sortie: error:") and field in lines[0], lines
    assert "Traceback" not in result.stderr


def test_a_slash_8_is_still_allowed_and_wider_only_when_asked(tmp_path: Path):
    eight = plan("--stack", "aws-p4d", "--set", "sshAllowedCidrs=[10.0.0.0/8]", "--json",
                 cwd=tmp_path)
    assert eight.returncode == 0, eight.stderr
    assert json.loads(eight.stdout)["security"]["world_ssh"] is False
    wide = plan("--stack", "aws-p4d", "--set", "sshAllowedCidrs=[0.0.0.0/1,128.0.0.0/1]",
                "--set", "allowWorldSsh=true", "--json", cwd=tmp_path)
    assert wide.returncode == 0, wide.stderr
    assert json.loads(wide.stdout)["security"]["world_ssh"] is True


def test_a_profile_that_is_not_utf8_or_not_sortie_settings_is_one_line(tmp_path: Path):
    """Before: a non-UTF-8 profile ended in a traceback (only YAMLError was caught)."""
    from sortie.core.errors import UsageError
    from sortie.stacks.profiles import load_profile

    (tmp_path / "Pulumi.latin1.yaml").write_bytes(b"config:\n  sortie:owner: J\xfcrgen\n")
    with pytest.raises(UsageError, match=r"Pulumi\.latin1\.yaml: not UTF-8 text \(byte 25"):
        load_profile("latin1", tmp_path)
    (tmp_path / "Pulumi.provider.yaml").write_text("config:\n  aws:region: eu-west-1\n")
    with pytest.raises(UsageError, match=r"Pulumi\.provider\.yaml: 'aws:region' is not a sortie"):
        load_profile("provider", tmp_path)


def test_plan_gcp_a2_offline_with_cost(tmp_path: Path):
    result = plan("--stack", "gcp-a2", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "sortie:gcp:GpuCluster" in result.stdout
    assert "gcp:compute/firewall:Firewall" in result.stdout
    assert "58.77" in result.stdout and "235.10" in result.stdout  # 2 × a2-highgpu-8g, 4 h
    assert "project-wide SSH keys blocked" in result.stdout


def test_plan_azure_nd96_offline_with_cost(tmp_path: Path):
    result = plan("--stack", "azure-nd96", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "sortie:azure:GpuCluster" in result.stdout
    assert "azure-native:network:SecurityRule" in result.stdout
    assert "54.39" in result.stdout and "217.58" in result.stdout  # 2 × ND96asr_v4, 4 h
    assert "other inbound traffic" in result.stdout and "denied" in result.stdout


def test_plan_json_shows_azure_nd96s_infiniband_layout_in_its_inputs(tmp_path: Path):
    """InfiniBand joins only VMs of one availability set (or a Uniform set): the plan says which
    layout, and the VMs' own declared inputs show it (before: a Flexible scale set, no IB)."""
    done = plan("--stack", "azure-nd96", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert document["interconnect"].startswith("InfiniBand (one availability set")
    by_type: dict[str, list[dict]] = {}
    for resource in document["resources"]:
        by_type.setdefault(resource["type"], []).append(resource)
    (group,) = by_type["azure-native:compute:AvailabilitySet"]
    assert group["inputs"]["platformFaultDomainCount"] == 1
    assert "azure-native:compute:VirtualMachineScaleSet" not in by_type
    vms = by_type["azure-native:compute:VirtualMachine"]
    assert len(vms) == 2 and all("availabilitySet" in vm["inputs"] for vm in vms)
    spot = json.loads(plan("--stack", "azure-nd96", "--json", "--set", "spot=true",
                           cwd=tmp_path).stdout)
    assert spot["interconnect"].startswith("TCP (Spot VMs cannot join an availability set")
    assert spot["outputs"]["train_env"]["NCCL_IB_DISABLE"] == "1"
