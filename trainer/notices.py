"""Each cloud's preemption notice, as a node reads it from the cloud's metadata service: where it
is asked for and what says the machine will go. Plain HTTP, no torch: the trainer's flags
(`config.py`) name the clouds here. A new cloud with spot notices adds its reading here."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

DEFAULT_METADATA = {
    "aws": "http://169.254.169.254",
    "gcp": "http://metadata.google.internal",
    "azure": "http://169.254.169.254",
}


def _get(url: str, headers: dict[str, str], method: str = "GET", timeout: float = 2.0) -> str:
    request = urllib.request.Request(url, headers=headers, method=method)
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return response.read().decode()


NOTICES = ("none", *DEFAULT_METADATA)  # `--preempt-notice` choices: none, or a cloud here


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
