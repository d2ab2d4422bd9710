"""Small doubles of the two list APIs the GCP and Azure tag sweeps call, served over HTTP on
loopback so that the real SDK clients (google-cloud-asset over REST, azure-mgmt-resource) do the
requests, the paging and the parsing. There is no emulator of either service to run here.

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

    def page(self, items: list[dict[str, Any]], token: str | None) -> tuple[list, int | None]:
        start = int(token or 0)
        after = start + PAGE_SIZE
        return items[start:after], after if after < len(items) else None


class GcpAssetDouble(CloudApiDouble):
    """`GET /v1/projects/<p>:searchAllResources` with `query` (only `labels.<key>:<value>`),
    `assetTypes` and `pageToken`."""

    def answer(self, path: str, query: dict[str, list[str]]) -> tuple[int, dict[str, Any]]:
        match = re.fullmatch(r"/v1/projects/([^/:]+):searchAllResources", path)
        if not match:
            return 404, {"error": {"code": 404, "message": f"no such method: {path}"}}
        found = [r for r in self.resources if r["project"] == f"projects/{match[1]}"]
        if query.get("assetTypes"):
            found = [r for r in found if r["assetType"] in query["assetTypes"]]
        if query.get("query"):
            label = re.fullmatch(r"labels\.([a-z0-9_-]+):(\S+)", query["query"][0])
            if not label:
                return 400, {"error": {"code": 400, "message": "unsupported query"}}
            found = [r for r in found if r.get("labels", {}).get(label[1]) == label[2]]
        results, after = self.page(found, query.get("pageToken", [None])[0])
        return 200, {"results": results, **({"nextPageToken": str(after)} if after else {})}

    def add(self, project: str, asset_type: str, name: str, location: str = "global",
            labels: dict[str, str] | None = None, **attributes: str) -> str:
        service = asset_type.split("/")[0]
        plural = {"Instance": "instances", "Disk": "disks", "Network": "networks",
                  "Subnetwork": "subnetworks", "Firewall": "firewalls",
                  "ResourcePolicy": "resourcePolicies", "Bucket": "buckets",
                  "ServiceAccount": "serviceAccounts"}[asset_type.split("/")[1]]
        where = "global" if location == "global" else \
            f"{'zones' if re.search(r'-[a-z]$', location) else 'regions'}/{location}"
        full_name = f"//{service}/{name}" if service.startswith("storage") else \
            f"//{service}/projects/{project}/{where}/{plural}/{name}"
        self.resources.append({"name": full_name, "assetType": asset_type, "displayName": name,
                               "project": f"projects/{project}", "location": location,
                               "labels": labels or {}, "additionalAttributes": attributes})
        return full_name


class AzureResourceManagerDouble(CloudApiDouble):
    """`GET /subscriptions/<s>/resources` and `/resourcegroups` with a `$filter` of
    `tagName eq '<k>' and tagValue eq '<v>'` (the only one the sweep sends), paged by nextLink.
    Every request must carry a bearer token, as Resource Manager requires."""

    def answer(self, path: str, query: dict[str, list[str]]) -> tuple[int, dict[str, Any]]:
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
        body: dict[str, Any] = {"value": results}
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
                status, body = double.answer(url.path, query)
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
