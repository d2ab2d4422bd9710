"""Preemption: SIGTERM (what clouds send at shutdown) or the cloud's metadata notice sets a flag;
every rank all-reduces it each step so that all stop at the same step and save together."""

from __future__ import annotations

import json
import signal
import sys
import threading
import urllib.error
import urllib.request

import torch
import torch.distributed as dist

DEFAULT_METADATA = {
    "aws": "http://169.254.169.254",
    "gcp": "http://metadata.google.internal",
    "azure": "http://169.254.169.254",
}


def _get(url: str, headers: dict[str, str], method: str = "GET", timeout: float = 2.0) -> str:
    request = urllib.request.Request(url, headers=headers, method=method)
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return response.read().decode()


def notice_posted(cloud: str, base: str) -> bool:
    """True once the cloud has announced that this instance will be preempted."""
    try:
        if cloud == "aws":  # IMDSv2: a session token first; 404 until a spot notice exists
            token = _get(f"{base}/latest/api/token",
                         {"X-aws-ec2-metadata-token-ttl-seconds": "300"}, method="PUT")
            _get(f"{base}/latest/meta-data/spot/instance-action",
                 {"X-aws-ec2-metadata-token": token})
            return True
        if cloud == "gcp":
            body = _get(f"{base}/computeMetadata/v1/instance/preempted",
                        {"Metadata-Flavor": "Google"})
            return body.strip().upper() == "TRUE"
        if cloud == "azure":
            body = _get(f"{base}/metadata/scheduledevents?api-version=2020-07-01",
                        {"Metadata": "true"})
            return any(e.get("EventType") == "Preempt" for e in json.loads(body).get("Events", []))
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return False
        raise
    raise ValueError(f"unknown cloud {cloud!r}")


class PreemptionWatch:
    """Sets ``requested`` on SIGTERM or on the cloud's notice (polled in a daemon thread)."""

    def __init__(self, cloud: str = "none", metadata_url: str = "", poll_s: float = 1.0) -> None:
        self.requested = threading.Event()
        self.reason = ""
        signal.signal(signal.SIGTERM, self._on_sigterm)
        if cloud != "none":
            base = (metadata_url or DEFAULT_METADATA[cloud]).rstrip("/")
            threading.Thread(target=self._poll, args=(cloud, base, poll_s), daemon=True,
                             name="preemption-notice").start()

    def _on_sigterm(self, _signum: int, _frame: object) -> None:
        self.reason = self.reason or "SIGTERM"
        self.requested.set()

    def _poll(self, cloud: str, base: str, poll_s: float) -> None:
        warned = False
        while not self.requested.wait(poll_s):
            try:
                if notice_posted(cloud, base):
                    self.reason = self.reason or f"{cloud} preemption notice"
                    self.requested.set()
            except (OSError, ValueError) as exc:  # metadata unreachable: keep training, say so once
                if not warned:
                    print(f"trainer: cannot read the {cloud} preemption notice at {base}: {exc}",
                          file=sys.stderr, flush=True)
                    warned = True

    def agreed(self, device: torch.device) -> bool:
        """Whether any rank has been asked to stop (a collective: every rank calls it each step)."""
        flag = torch.tensor([1.0 if self.requested.is_set() else 0.0], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())
