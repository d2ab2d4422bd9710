"""Everything sortie's controller knows about Google Cloud: preemption notice lead time,
credentials, the bucket, and the sweep that proves a teardown (with the command removing each
leftover).

The sweep asks the APIs that own each kind (Compute, IAM, Storage, Secret Manager), which answer
with what exists now (Cloud Asset Inventory lags by minutes): by label, and the kinds that take
no labels (network, subnetwork, firewall rules, placement policy, the nodes' service accounts) by
the names the program gives them.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sortie.infra.cloud_home import Cloud, Leftover, SshWait, SweepUnavailable
from sortie.infra.gcp.facts import node_account_prefix
from sortie.infra.spec import TAG_CLUSTER, TAG_ID, ClusterSpec

# Cloud Asset Inventory indexes a project minutes behind the owning APIs: just-deleted resources
# would show as leftovers and just-created ones be missed. Compute, IAM and Storage answer with
# what exists now, so the proof asks them.
GCP_APIS = {"compute": "https://compute.googleapis.com/compute/v1",
            "iam": "https://iam.googleapis.com/v1",
            "storage": "https://storage.googleapis.com/storage/v1",
            "secretmanager": "https://secretmanager.googleapis.com/v1",
            "serviceusage": "https://serviceusage.googleapis.com/v1",
            "orgpolicy": "https://orgpolicy.googleapis.com/v2"}
# The services the program's resources belong to: a project has only some on by default, and
# `pulumi up` fails half-way on one that is off (`SERVICE_DISABLED`).
GCP_SERVICES = ("compute.googleapis.com", "iam.googleapis.com", "storage.googleapis.com",
                "secretmanager.googleapis.com")
# Compute kinds: (leftover kind, collection, listed per zone/region (aggregated) or globally,
# found by label or, for kinds that take no labels, by the name the program gives them).
GCP_COMPUTE = (("compute:instance", "instances", "aggregated", "label"),
               ("compute:disk", "disks", "aggregated", "label"),
               ("compute:network", "networks", "global", "name"),
               ("compute:subnetwork", "subnetworks", "aggregated", "name"),
               ("compute:firewall", "firewalls", "global", "name"),
               ("compute:resourcePolicy", "resourcePolicies", "aggregated", "name"))
# How to remove each kind by hand.
GCP_REMOVE = {
    "compute:instance":
        "gcloud compute instances delete {name} --zone {location} --project {project} --quiet",
    "compute:disk":
        "gcloud compute disks delete {name} --zone {location} --project {project} --quiet",
    "compute:network": "gcloud compute networks delete {name} --project {project} --quiet",
    "compute:subnetwork": "gcloud compute networks subnets delete {name} "
                          "--region {location} --project {project} --quiet",
    "compute:firewall": "gcloud compute firewall-rules delete {name} --project {project} --quiet",
    "compute:resourcePolicy": "gcloud compute resource-policies delete {name} "
                              "--region {location} --project {project} --quiet",
    "storage:bucket": "gcloud storage rm --recursive gs://{name}",
    "iam:serviceAccount":
        "gcloud iam service-accounts delete {name} --project {project} --quiet",
    "secretmanager:secret": "gcloud secrets delete {name} --project {project} --quiet",
}
# Pulumi names the unlabelled kinds "<cluster>-<logical name>-<random hex>" (see
# infra/gcp/program.py).
# (A3's GPU NICs: `gpu-net-N`, `gpu-subnet-N`, `gpu-net-N-internal`, one of each per NIC.)
GCP_LOGICAL_NAMES = (r"(network|subnet|ssh-ipv[46]|intra-cluster|placement|gpu-net-[0-9]{1,2}"
                     r"(-internal)?|gpu-subnet-[0-9]{1,2})")


def gcp_project(spec: ClusterSpec) -> str:
    """The project the cluster lives in: the profile's, else the one the provider would use."""
    for project in (spec.project, os.environ.get("GOOGLE_PROJECT"),
                    os.environ.get("GOOGLE_CLOUD_PROJECT"),
                    os.environ.get("CLOUDSDK_CORE_PROJECT")):
        if project:
            return project
    import google.auth

    _, project = google.auth.default()
    if not project:
        raise SweepUnavailable("no GCP project: set sortie:project or GOOGLE_PROJECT")
    return project


def gcp_session() -> Any:
    """An HTTP session signed with the application default credentials."""
    import google.auth
    from google.auth.transport.requests import AuthorizedSession

    credentials, _ = google.auth.default(
        scopes=["https://www.googleapis.com/auth/cloud-platform"])
    return AuthorizedSession(credentials)


def _gcp_pages(session: Any, url: str, params: dict[str, str] | None = None
               ) -> Iterator[dict[str, Any]]:
    """Every page of a Google list call (pageToken paging); an error stops the sweep."""
    token = None
    while True:
        response = session.get(url, params={**(params or {}),
                                            **({"pageToken": token} if token else {})},
                                timeout=60)
        if response.status_code != 200:
            try:
                message = response.json()["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = response.text[:200]
            raise SweepUnavailable(f"{url}: HTTP {response.status_code}: {message}")
        body = response.json()
        yield body
        token = body.get("nextPageToken")
        if not token:
            return


def _last(url: str | None) -> str:
    return (url or "").rstrip("/").rsplit("/", 1)[-1]


def gcp_leftovers(cluster: str, project: str, session: Any = None,
                  apis: dict[str, str] | None = None,
                  tag: tuple[str, str] | None = None) -> list[Leftover]:
    """Every GCP resource of the sortie that still exists in ``project``: those labelled with
    ``tag`` (its `sortie-id`; default `sortie-cluster=<cluster>`), its bucket and its host-key
    secrets; the unlabelled kinds and its nodes' service accounts by name (their names start
    with the cluster's)."""
    session, apis = session or gcp_session(), apis or GCP_APIS
    key, value = tag or (TAG_CLUSTER, cluster)
    named = re.compile(rf"{re.escape(cluster)}-{GCP_LOGICAL_NAMES}-[0-9a-f]+")

    # Unlabelled kinds: by the names the program gives them, and then (a sortie with an id)
    # by the id their description carries, since two sorties may share a name.
    note = re.compile(rf"(^|\W)sortie-id={re.escape(value)}(\W|$)") if key == TAG_ID else None

    def described(item: dict[str, Any]) -> bool:
        return note is None or bool(note.search(item.get("description") or ""))

    def ours(item: dict[str, Any], match: str) -> bool:
        if match == "label":
            return (item.get("labels") or {}).get(key) == value
        return bool(named.fullmatch(item.get("name", ""))) and described(item)

    def leftover(kind: str, ident: str, name: str, location: str = "") -> Leftover:
        return Leftover(kind, ident, GCP_REMOVE[kind].format(name=name, location=location,
                                                             project=project))

    found: list[Leftover] = []
    base = f"{apis['compute']}/projects/{project}"
    for kind, collection, listing, match in GCP_COMPUTE:
        url = f"{base}/aggregated/{collection}" if listing == "aggregated" else \
            f"{base}/global/{collection}"
        for page in _gcp_pages(session, url):
            groups = page.get("items", {})
            items = [item for group in groups.values() for item in group.get(collection, [])] \
                if listing == "aggregated" else groups
            found += [leftover(kind, item.get("selfLink", item["name"]), item["name"],
                               _last(item.get("zone") or item.get("region")))
                      for item in items if ours(item, match)]
    accounts = re.compile(rf"{re.escape(node_account_prefix(cluster))}[0-9]+@.*")
    for page in _gcp_pages(session, f"{apis['iam']}/projects/{project}/serviceAccounts"):
        found += [leftover("iam:serviceAccount", item["name"], item["email"])
                  for item in page.get("accounts", [])
                  if accounts.fullmatch(item["email"]) and described(item)]
    for page in _gcp_pages(session, f"{apis['storage']}/b", {"project": project}):
        found += [leftover("storage:bucket", f"gs://{item['name']}", item["name"])
                  for item in page.get("items", []) if ours(item, "label")]
    for page in _gcp_pages(session, f"{apis['secretmanager']}/projects/{project}/secrets"):
        found += [leftover("secretmanager:secret", item["name"], _last(item["name"]))
                  for item in page.get("secrets", []) if ours(item, "label")]
    return found


GCP_STOPPED = ("TERMINATED", "STOPPED", "SUSPENDED")  # an instance's status once powered off


def gcp_running(cluster: str, project: str, session: Any = None,
                apis: dict[str, str] | None = None,
                tag: tuple[str, str] | None = None) -> list[str]:
    """The sortie's instances (by label) that Compute Engine says are not stopped: an
    in-guest power-off leaves an instance TERMINATED (its disks kept until destroyed)."""
    session, apis = session or gcp_session(), apis or GCP_APIS
    key, value = tag or (TAG_CLUSTER, cluster)
    url = f"{apis['compute']}/projects/{project}/aggregated/instances"
    return [item.get("selfLink", item["name"])
            for page in _gcp_pages(session, url)
            for group in page.get("items", {}).values() for item in group.get("instances", [])
            if (item.get("labels") or {}).get(key) == value
            and item.get("status") not in GCP_STOPPED]


def disabled_services(project: str, session: Any = None,
                      apis: dict[str, str] | None = None) -> list[str]:
    """The services of `GCP_SERVICES` that are not enabled in ``project``."""
    session, apis = session or gcp_session(), apis or GCP_APIS
    disabled = []
    for service in GCP_SERVICES:
        [answer] = _gcp_pages(session, f"{apis['serviceusage']}/projects/{project}/services/"
                                       f"{service}")
        if answer.get("state") != "ENABLED":
            disabled.append(service)
    return disabled


def _get(session: Any, url: str) -> tuple[int, dict[str, Any]]:
    response = session.get(url, timeout=60)
    try:
        body = response.json()
    except ValueError:
        body = {}
    return response.status_code, body if isinstance(body, dict) else {}


def image_problems(spec: ClusterSpec, session: Any = None,
                   apis: dict[str, str] | None = None) -> list[str]:
    """The default image family, asked as the program's boot disk asks (its newest image that
    is not deprecated): a line when there is none, or it is deprecated. A profile's own `image`
    is not looked up."""
    if spec.image:
        return []
    session, apis = session or gcp_session(), apis or GCP_APIS
    family = spec.instance.image
    status, body = _get(session, f"{apis['compute']}/{family}")
    fix = f"(set sortie:image to an image with an NVIDIA driver for the {spec.instance.gpu_model})"
    if status == 404:
        return [f"sortie:instanceType {spec.instance_type}: no image in family {family} {fix}"]
    if status != 200:
        raise SweepUnavailable(f"{family}: HTTP {status}")
    state = (body.get("deprecated") or {}).get("state")
    if state in ("DEPRECATED", "OBSOLETE", "DELETED"):
        return [f"sortie:instanceType {spec.instance_type}: the newest image of family {family} "
                f"is {state.lower()} {fix}"]
    return []


def os_login_required(project: str, session: Any = None,
                      apis: dict[str, str] | None = None) -> bool:
    """Whether an organisation policy makes the project's VMs use OS Login, which ignores the
    program's `ssh-keys` metadata: the nodes would refuse the cluster's key."""
    session, apis = session or gcp_session(), apis or GCP_APIS
    status, body = _get(session, f"{apis['orgpolicy']}/projects/{project}/policies/"
                                 "compute.requireOsLogin:getEffectivePolicy")
    if status != 200:
        raise SweepUnavailable(f"compute.requireOsLogin: HTTP {status}")
    return any(rule.get("enforce") for rule in (body.get("spec") or {}).get("rules", []))


def gcp_preflight(spec: ClusterSpec) -> list[str]:
    """What the project lacks for the program, with the command that fixes it. A check that
    cannot ask (reading an organisation's policy needs a role of its own) is passed over."""
    project = gcp_project(spec)
    problems = [f"service {service} is not enabled in project {project} (run `gcloud services "
                f"enable {service} --project {project}`)"
                for service in disabled_services(project)]
    with contextlib.suppress(SweepUnavailable):
        problems += image_problems(spec)
    with contextlib.suppress(SweepUnavailable):
        if os_login_required(project):
            problems.append(f"project {project} requires OS Login (organisation policy "
                            "constraints/compute.requireOsLogin), which ignores the cluster's "
                            "SSH key: use a project without that policy")
    return problems


def has_credentials() -> bool:
    adc = os.environ.get("GOOGLE_APPLICATION_CREDENTIALS") or str(
        Path.home() / ".config/gcloud/application_default_credentials.json")
    return bool(os.environ.get("GOOGLE_CREDENTIALS")) or Path(adc).is_file()


CLOUD = Cloud(
    name="gcp", preemption_notice_s=45.0, machine_type="gcp:compute/instance:Instance",
    ssh_wait=SshWait(1200, "boot, the host key from Secret Manager (a new grant applies "
                           "typically in 2 min, up to 7)"),
    bucket_kinds=("storage:bucket",), has_credentials=has_credentials,
    credentials_hint="no Google Cloud credentials (set GOOGLE_APPLICATION_CREDENTIALS or run "
                     "`gcloud auth application-default login`)",
    leftovers=lambda spec: gcp_leftovers(spec.cluster, gcp_project(spec), tag=spec.sweep_tag),
    preflight=gcp_preflight,
    # The catalog's zones for the type (Google's GPU regions and zones table): a launch that
    # finds no capacity in one tries the next, as on AWS.
    offered_zones=lambda spec: list(spec.instance.regions.get(spec.region, ())),
    running_machines=lambda spec: gcp_running(spec.cluster, gcp_project(spec),
                                              tag=spec.sweep_tag))
