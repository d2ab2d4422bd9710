"""How a GCP cluster's declared resources read to a reviewer (`sortie plan`): who reaches SSH,
whether the bucket is private, where the host keys live and who may read them."""

from __future__ import annotations

from typing import Any

from sortie.infra.review import Evaluation, SecuritySummary


def security_summary(evaluation: Evaluation) -> SecuritySummary:
    """Read the security posture back from what the program declared (not from the spec)."""
    rules = [r.state for r in evaluation.of_type("gcp:compute/firewall:Firewall")]

    def opens_ssh(rule: dict[str, Any]) -> bool:
        return any(a["protocol"] == "all" or (a["protocol"] == "tcp" and (
            not a.get("ports") or "22" in a["ports"])) for a in rule.get("allows", []))

    ingress = [r for r in rules if r.get("direction", "INGRESS") == "INGRESS"]
    ssh_from = [cidr for r in ingress if opens_ssh(r) for cidr in r.get("sourceRanges", [])]
    intra = any(r.get("sourceTags") and r["sourceTags"] == r.get("targetTags") for r in ingress)
    buckets = [b.state for b in evaluation.of_type("gcp:storage/bucket:Bucket")]
    grants = evaluation.of_type("gcp:storage/bucketIAMMember:BucketIAMMember")
    instances = [i.state for i in evaluation.of_type("gcp:compute/instance:Instance")]
    blocked = all(i["metadata"].get("block-project-ssh-keys") == "TRUE" for i in instances)
    guarded = _keys_guarded(evaluation)
    return SecuritySummary(
        ssh_from=ssh_from, intra_cluster=intra, bucket_managed=bool(buckets),
        bucket_public=any(b.get("publicAccessPrevention") != "enforced" for b in buckets),
        bucket_encrypted=bool(buckets),  # GCS encrypts every object at rest, always
        bucket_versioned=all(b.get("versioning", {}).get("enabled") for b in buckets),
        bucket_tls_only=bool(buckets),  # the GCS API is HTTPS only
        details={"project-wide SSH keys blocked": "yes" if blocked else "NO",
                 "node accounts reach": ", ".join(sorted(
                     {f"{g.state['role']} on {g.state['bucket']}" for g in grants}
                     | ({"each its own host key"} if guarded else set()))),
                 "host private keys": _where_host_keys_live(instances, guarded)})


def _keys_guarded(evaluation: Evaluation) -> bool:
    """One secret per node, each readable by one member only: its own node's account."""
    instances = [i.state for i in evaluation.of_type("gcp:compute/instance:Instance")]
    accounts = [f"serviceAccount:{i['serviceAccount']['email']}" for i in instances]
    readers: dict[str, list[str]] = {}
    for grant in evaluation.of_type("gcp:secretmanager/secretIamMember:SecretIamMember"):
        readers.setdefault(grant.state["secretId"], []).append(grant.state["member"])
    secrets = evaluation.of_type("gcp:secretmanager/secret:Secret")
    return (len(secrets) == len(readers) == len(instances) == len(set(accounts))
            and sorted(m for members in readers.values() for m in members) == sorted(accounts))


def _where_host_keys_live(instances: list[dict[str, Any]], guarded: bool) -> str:
    if any("PRIVATE KEY" in i["metadata"].get("user-data", "") for i in instances):
        return "IN USER-DATA METADATA (readable by anyone who may read the instance)"
    if guarded:
        return "Secret Manager, one secret per node, readable only by its node's own account"
    return "Secret Manager, NOT limited to each node's own account"
