"""How an AWS cluster's declared resources read to a reviewer (`sortie plan`): who reaches SSH,
whether the bucket is private, where the host keys live and who may read them."""

from __future__ import annotations

import json
from typing import Any

from sortie.infra.review import Evaluation, SecuritySummary


def _reaches_ssh(rule: dict[str, Any]) -> bool:
    if rule.get("ipProtocol") == "-1":
        return True
    return rule.get("ipProtocol") == "tcp" and rule["fromPort"] <= 22 <= rule["toPort"]


def security_summary(evaluation: Evaluation) -> SecuritySummary:
    """Read the security posture back from what the program declared (not from the spec)."""
    ingress = [r.state for r in evaluation.of_type(
        "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule")]
    ssh_from = [rule.get("cidrIpv4") or rule["cidrIpv6"] for rule in ingress
                if _reaches_ssh(rule) and (rule.get("cidrIpv4") or rule.get("cidrIpv6"))]
    intra = any(rule.get("referencedSecurityGroupId") == rule["securityGroupId"]
                and rule["ipProtocol"] == "-1" for rule in ingress)
    blocks = evaluation.of_type("aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock")
    public = not blocks or not all(blocks[0].state.get(flag) for flag in (
        "blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls", "restrictPublicBuckets"))
    versioning = evaluation.of_type("aws:s3/bucketVersioning:BucketVersioning")
    policies = [json.loads(p.state["policy"]) for p in
                evaluation.of_type("aws:s3/bucketPolicy:BucketPolicy")]
    tls_only = any(s["Effect"] == "Deny" and s.get("Condition", {}).get("Bool", {}).get(
        "aws:SecureTransport") == "false" for p in policies for s in p["Statement"])
    templates = [t.state for t in evaluation.of_type("aws:ec2/launchTemplate:LaunchTemplate")]
    imds_v2 = bool(templates) and all(
        t["metadataOptions"]["httpTokens"] == "required" for t in templates)
    managed = bool(evaluation.of_type("aws:s3/bucket:Bucket"))
    return SecuritySummary(
        ssh_from=ssh_from, intra_cluster=intra, bucket_managed=managed,
        bucket_public=managed and public,
        bucket_encrypted=bool(evaluation.of_type(
            "aws:s3/bucketServerSideEncryptionConfiguration:"
            "BucketServerSideEncryptionConfiguration")),
        bucket_versioned=any(v.state["versioningConfiguration"]["status"] == "Enabled"
                             for v in versioning),
        bucket_tls_only=tls_only,
        details={"IMDSv2 required": "yes" if imds_v2 else "NO",
                 "node role reaches": ", ".join(sorted(_role_policy_resources(evaluation))),
                 "host private keys": _where_host_keys_live(evaluation)})


def _where_host_keys_live(evaluation: Evaluation) -> str:
    """Read back: one secret per node, each with a policy that refuses other instances; or,
    if the program ever puts a key in user data again, say so."""
    instances = evaluation.of_type("aws:ec2/instance:Instance")
    if any("PRIVATE KEY" in node.state.get("userData", "") for node in instances):
        return "IN USER DATA (readable through IMDS and instance attributes)"
    policies = [json.loads(p.state["policy"]) for p in
                evaluation.of_type("aws:secretsmanager/secretPolicy:SecretPolicy")]
    guarded = [p for p in policies if any(
        s["Effect"] == "Deny" and "ec2:SourceInstanceARN" in s.get("Condition", {}).get(
            "StringNotEquals", {}) for s in p["Statement"])]
    if len(guarded) == len(instances) == len(
            evaluation.of_type("aws:secretsmanager/secret:Secret")):
        return "Secrets Manager, one secret per node, readable only from its own instance"
    return "Secrets Manager, NOT limited to each node's own instance"


def _role_policy_resources(evaluation: Evaluation) -> set[str]:
    """Every ARN the nodes' inline role policies grant anything on."""
    return {arn for policy in evaluation.of_type("aws:iam/rolePolicy:RolePolicy")
            for statement in json.loads(policy.state["policy"])["Statement"]
            for arn in statement["Resource"]}
