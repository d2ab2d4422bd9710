"""Small doubles of the list APIs the GCP and Azure sweeps call, served over HTTP on loopback so
that the real clients (an authorized `requests` session for GCP, azure-mgmt-resource) do the
requests, the paging and the parsing. There is no emulator of these services to run here.

Each double keeps a list of resources in the service's JSON shape, answers only the requests the
sweeps make, applies the same filters as the service, returns two results per page (so paging
is exercised), and records every request it was sent.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

PAGE_SIZE = 2


@dataclass
class CloudApiDouble:
    resources: list[dict[str, Any]] = field(default_factory=list)
    groups: list[dict[str, Any]] = field(default_factory=list)  # Azure resource groups
    requests: list[tuple[str, dict[str, list[str]]]] = field(default_factory=list)
    endpoint: str = ""
    fail_with: int | None = None  # answer every request with this HTTP status

    def act(self, path: str, query: dict[str, list[str]]) -> tuple[int, dict[str, Any]]:
        """A POST: none of the services here takes one but where a double says so."""
        return 405, {"error": {"code": "MethodNotAllowed", "message": path}}

    def page(self, items: list[dict[str, Any]], token: str | None) -> tuple[list, int | None]:
        start = int(token or 0)
        after = start + PAGE_SIZE
        return items[start:after], after if after < len(items) else None


class GcpApisDouble(CloudApiDouble):
    """The list calls of the APIs that own what a GCP sortie makes, as the sweep sends them:
    Compute `GET /compute/v1/projects/<p>/aggregated/<collection>` (items grouped by
    `zones/<z>` or `regions/<r>`) and `.../global/<collection>`, IAM
    `GET /v1/projects/<p>/serviceAccounts`, Storage `GET /storage/v1/b?project=<p>`, Secret
    Manager `GET /secretmanager/v1/projects/<p>/secrets` (the real one answers at its own host's
    `/v1`); all paged by pageToken. Service Usage `GET /serviceusage/v1/projects/<p>/services/
    <service>` says each service is enabled, except those in ``disabled``. Every request must
    carry a bearer token."""

    disabled: tuple[str, ...] = ()
    # Compute `GET /compute/v1/projects/<p>/global/images/family/<f>`: the family's newest
    # image (every family has one unless ``families`` lists those that do, by name, each with
    # its `deprecated` state or None); Org Policy `GET /v2/projects/<p>/policies/
    # compute.requireOsLogin:getEffectivePolicy` enforces it when ``os_login`` is set.
    families: dict[str, str | None] | None = None
    os_login: bool = False

    # kind -> (collection, where it lives: "zones", "regions" or "global")
    COMPUTE = {"compute:instance": ("instances", "zones"), "compute:disk": ("disks", "zones"),
               "compute:network": ("networks", "global"),
               "compute:subnetwork": ("subnetworks", "regions"),
               "compute:firewall": ("firewalls", "global"),
               "compute:resourcePolicy": ("resourcePolicies", "regions")}

    def answer(self, path: str, query: dict[str, list[str]]) -> tuple[int, dict[str, Any]]:
        token = query.get("pageToken", [None])[0]
        if match := re.fullmatch(r"/compute/v1/projects/([^/]+)/global/images/family/([\w-]+)",
                                 path):
            if self.families is not None and match[2] not in self.families:
                return 404, {"error": {"code": 404, "message": f"family {match[2]} not found"}}
            state = (self.families or {}).get(match[2])
            return 200, {"name": f"{match[2]}-v20261101", "family": match[2],
                         **({"deprecated": {"state": state}} if state else {})}
        if match := re.fullmatch(r"/v2/projects/([^/]+)/policies/compute\.requireOsLogin:"
                                 r"getEffectivePolicy", path):
            return 200, {"name": f"projects/{match[1]}/policies/compute.requireOsLogin",
                         "spec": {"rules": [{"enforce": self.os_login}]}}
        if match := re.fullmatch(r"/compute/v1/projects/([^/]+)/(aggregated|global)/(\w+)",
                                 path):
            found = [r for r in self.resources if r["api"] == "compute"
                     and r["project"] == match[1] and r["collection"] == match[3]
                     and (r["scope"] == "global") == (match[2] == "global")]
            results, after = self.page(found, token)
            if match[2] == "global":
                items: Any = [r["item"] for r in results]
            else:
                items = {}
                for r in results:
                    items.setdefault(r["scope"], {}).setdefault(match[3], []).append(r["item"])
            return 200, {"items": items, **({"nextPageToken": str(after)} if after else {})}
        if match := re.fullmatch(r"/v1/projects/([^/]+)/serviceAccounts", path):
            found = [r for r in self.resources if r["api"] == "iam" and r["project"] == match[1]]
            results, after = self.page(found, token)
            return 200, {"accounts": [r["item"] for r in results],
                         **({"nextPageToken": str(after)} if after else {})}
        if match := re.fullmatch(r"/serviceusage/v1/projects/([^/]+)/services/([\w.]+)", path):
            return 200, {"name": f"projects/{sum(map(ord, match[1]))}/services/{match[2]}",
                         "state": "DISABLED" if match[2] in self.disabled else "ENABLED"}
        if match := re.fullmatch(r"/secretmanager/v1/projects/([^/]+)/secrets", path):
            found = [r for r in self.resources
                     if r["api"] == "secretmanager" and r["project"] == match[1]]
            results, after = self.page(found, token)
            return 200, {"secrets": [r["item"] for r in results], "totalSize": len(found),
                         **({"nextPageToken": str(after)} if after else {})}
        if path == "/storage/v1/b" and query.get("project"):
            found = [r for r in self.resources if r["api"] == "storage"
                     and r["project"] == query["project"][0]]
            results, after = self.page(found, token)
            return 200, {"items": [r["item"] for r in results],
                         **({"nextPageToken": str(after)} if after else {})}
        return 404, {"error": {"code": 404, "message": f"no such method: {path}"}}

    def add(self, project: str, kind: str, name: str, location: str = "",
            labels: dict[str, str] | None = None, description: str = "",
            status: str = "RUNNING") -> str:
        """A resource of ``kind`` ("compute:instance", "iam:serviceAccount" with its email as
        the name, "storage:bucket", "secretmanager:secret"); returns the id the sweep reports it
        by."""
        if kind == "iam:serviceAccount":
            ident = f"projects/{project}/serviceAccounts/{name}"
            self.resources.append({"api": "iam", "project": project,
                                   "item": {"name": ident, "email": name,
                                            "description": description}})
            return ident
        if kind == "secretmanager:secret":  # named by the project's number, as GCP answers
            ident = f"projects/{sum(map(ord, project))}/secrets/{name}"
            self.resources.append({"api": "secretmanager", "project": project,
                                   "item": {"name": ident, "labels": labels or {},
                                            "replication": {"automatic": {}}}})
            return ident
        if kind == "storage:bucket":
            self.resources.append({"api": "storage", "project": project,
                                   "item": {"name": name, "labels": labels or {}}})
            return f"gs://{name}"
        collection, where = self.COMPUTE[kind]
        scope = "global" if where == "global" else f"{where}/{location}"
        base = f"{self.endpoint}/compute/v1/projects/{project}"
        item = {"name": name, "selfLink": f"{base}/{scope}/{collection}/{name}",
                "labels": labels or {}, "description": description}
        if where != "global":
            item[where[:-1]] = f"{base}/{scope}"  # "zone" or "region", a URL
        if kind == "compute:instance":
            item["status"] = status  # RUNNING, STOPPING, TERMINATED (powered off), ...
        self.resources.append({"api": "compute", "project": project, "collection": collection,
                               "scope": scope, "item": item})
        return item["selfLink"]


@dataclass
class AzureResourceManagerDouble(CloudApiDouble):
    """`GET /subscriptions/<s>/resources` and `/resourcegroups` with a `$filter` of
    `tagName eq '<k>' and tagValue eq '<v>'` (the only one the sweep sends), paged by nextLink;
    and `GET /subscriptions/<s>/providers/<namespace>`, every provider registered but those in
    ``unregistered``, and the caller's ``permissions``. Key Vault's `GET /subscriptions/<s>/
    providers/Microsoft.KeyVault/deletedVaults` lists ``deleted_vaults``, and `POST .../
    locations/<l>/deletedVaults/<name>/purge` removes one. Every request must carry a bearer
    token, as Resource Manager requires."""

    unregistered: tuple[str, ...] = ()
    deleted_vaults: list[dict[str, Any]] = field(default_factory=list)
    # `GET .../providers/Microsoft.Authorization/permissions`: the caller's roles (Owner's).
    # A virtual machine's power state (its instance view), by id: PowerState/running if unset.
    power: dict[str, str] = field(default_factory=dict)
    permissions: list[dict[str, Any]] = field(default_factory=lambda: [
        {"actions": ["*"], "notActions": [], "dataActions": [], "notDataActions": []}])

    def delete_vault(self, subscription: str, name: str, tags: dict[str, str]) -> str:
        """A vault deleted with its group, which Key Vault keeps; returns its deleted id."""
        vault_id = (f"/subscriptions/{subscription}/resourceGroups/sortie-x/providers/"
                    f"Microsoft.KeyVault/vaults/{name}")
        ident = (f"/subscriptions/{subscription}/providers/Microsoft.KeyVault/locations/eastus/"
                 f"deletedVaults/{name}")
        self.deleted_vaults.append({
            "id": ident, "name": name, "type": "Microsoft.KeyVault/deletedVaults",
            "properties": {"vaultId": vault_id, "location": "eastus", "tags": tags,
                           "deletionDate": "2026-11-23T08:00:00Z",
                           "scheduledPurgeDate": "2026-11-30T08:00:00Z",
                           "purgeProtectionEnabled": False}})
        return ident

    def act(self, path: str, query: dict[str, list[str]]) -> tuple[int, dict[str, Any]]:
        purge = re.fullmatch(r"/subscriptions/([^/]+)/providers/Microsoft.KeyVault/locations/"
                             r"([^/]+)/deletedVaults/([^/]+)/purge", path)
        found = [v for v in self.deleted_vaults if purge and v["name"] == purge[3]
                 and v["properties"]["location"] == purge[2]]
        if not found:
            return 404, {"error": {"code": "NotFound", "message": path}}
        self.deleted_vaults.remove(found[0])
        return 200, {}

    def answer(self, path: str, query: dict[str, list[str]]) -> tuple[int, dict[str, Any]]:
        view = re.fullmatch(r"(/subscriptions/.+/providers/Microsoft.Compute/virtualMachines/"
                            r"[^/]+)/instanceView", path)
        if view and any(r["id"] == view[1] for r in self.resources):
            return 200, {"statuses": [{"code": "ProvisioningState/succeeded"},
                                      {"code": self.power.get(view[1], "PowerState/running")}]}
        if re.fullmatch(r"/subscriptions/[^/]+/providers/Microsoft.KeyVault/deletedVaults", path):
            results, after = self.page(self.deleted_vaults, query.get("skiptoken", [None])[0])
            body: dict[str, Any] = {"value": results}
            if after:
                body["nextLink"] = f"{self.endpoint}{path}?{urlencode({'skiptoken': after})}"
            return 200, body
        if re.fullmatch(r"/subscriptions/[^/]+/providers/Microsoft.Authorization/permissions",
                        path):
            return 200, {"value": self.permissions}
        provider = re.fullmatch(r"/subscriptions/[^/]+/providers/([^/]+)", path)
        if provider:
            state = "NotRegistered" if provider[1] in self.unregistered else "Registered"
            return 200, {"id": path, "namespace": provider[1], "registrationState": state}
        match = re.fullmatch(r"/subscriptions/([^/]+)/(resources|resourcegroups)", path)
        if not match:
            return 404, {"error": {"code": "NotFound", "message": path}}
        items = self.resources if match[2] == "resources" else self.groups
        found = [r for r in items if r["id"].startswith(f"/subscriptions/{match[1]}/")]
        if "$filter" in query:
            tag = re.fullmatch(r"tagName eq '([^']+)' and tagValue eq '([^']*)'",
                               query["$filter"][0])
            if not tag:
                return 400, {"error": {"code": "InvalidFilter", "message": query["$filter"][0]}}
            found = [r for r in found if r.get("tags", {}).get(tag[1]) == tag[2]]
        results, after = self.page(found, query.get("skiptoken", [None])[0])
        body = {"value": results}
        if after:
            rest = {k: v[0] for k, v in query.items() if k != "skiptoken"}
            body["nextLink"] = f"{self.endpoint}{path}?{urlencode({**rest, 'skiptoken': after})}"
        return 200, body

    def add(self, subscription: str, resource_type: str, name: str, group: str,
            tags: dict[str, str] | None = None) -> str:
        group_id = f"/subscriptions/{subscription}/resourceGroups/{group}"
        if resource_type == "Microsoft.Resources/resourceGroups":
            self.groups.append({"id": group_id, "name": group, "location": "eastus",
                                "tags": tags or {}})
            return group_id
        resource_id = f"{group_id}/providers/{resource_type}/{name}"
        self.resources.append({"id": resource_id, "name": name, "type": resource_type,
                               "location": "eastus", "tags": tags or {}})
        return resource_id


def _handler(double: CloudApiDouble, needs_token: bool) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the http.server interface
            self.respond(double.answer)

        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.respond(double.act)

        def respond(self, handle: Any) -> None:
            url = urlsplit(self.path)
            query = parse_qs(url.query)
            double.requests.append((url.path, query))
            if double.fail_with:
                status, body = double.fail_with, {"error": {"code": double.fail_with,
                                                            "message": "refused by the double"}}
            elif needs_token and not self.headers.get("Authorization", "").startswith("Bearer "):
                status, body = 401, {"error": {"code": "AuthenticationFailed",
                                               "message": "no bearer token"}}
            else:
                status, body = handle(url.path, query)
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    return Handler


@contextmanager
def serving(double: CloudApiDouble, needs_token: bool = False) -> Iterator[CloudApiDouble]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(double, needs_token))
    double.endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield double
    finally:
        server.shutdown()
        server.server_close()
