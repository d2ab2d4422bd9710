"""Each cloud's preemption notice, as a node reads it from the cloud's metadata service: where it
is asked for and what says the machine will go. Plain HTTP, no torch: the trainer's flags
(`config.py`) name the clouds here. A new cloud with spot notices adds its reading here."""

from __future__ import annotations

import json
import time
import urllib.error
from collections.abc import Callable

DEFAULT_METADATA = {
    "aws": "http://169.254.169.254",
    "gcp": "http://metadata.google.internal",
    "azure": "http://169.254.169.254",
}

NOTICES = ("none", *DEFAULT_METADATA)  # `--preempt-notice` choices: none, or a cloud here

# IMDSv2: a session token lives as long as asked (at most 6 hours); one is kept and renewed a
# minute before it ends, not asked for on every poll (each PUT counts against IMDS's rate limit).
AWS_TOKEN_TTL_S = 21600
AWS_TOKEN_RENEW_S = 60
# Azure: "Scheduled Events is enabled for your service the first time you make a request for
# events. You should expect a delayed response in your first call of up to two minutes."
AZURE_FIRST_CALL_S = 120.0
POLL_TIMEOUT_S = 2.0
# Azure's Scheduled Events that end or pause this VM: a stop-and-checkpoint notice each, when
# its `Resources` name this VM (an event may be for another VM of the same availability set).
AZURE_NOTICE_EVENTS = frozenset({"Preempt", "Terminate", "Reboot", "Redeploy", "Freeze"})
AZURE_API = "api-version=2020-07-01"
# GCP: `maintenance-event` says NONE until a host maintenance is coming; a GPU VM is stopped for
# it (onHostMaintenance TERMINATE), about 60 s after the value changes.
GCP_NO_MAINTENANCE = "NONE"
# IMDS answers 429 past its rate (Azure: 5 requests a second per VM): the poll backs off,
# doubling, up to this, and returns to its pace once answered.
BACKOFF_MAX_S = 30.0


def _get(url: str, headers: dict[str, str], method: str = "GET",
         timeout: float = POLL_TIMEOUT_S) -> str:
    import urllib.request  # here: http.client costs every controller command that loads this

    request = urllib.request.Request(url, headers=headers, method=method)
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return response.read().decode()


class NoticeReader:
    """Asks one cloud's metadata service at ``base`` whether this machine is to be preempted,
    keeping between polls what the cloud lets a reader keep: AWS's session token, until shortly
    before it expires; Azure's first call, which may take two minutes, is allowed them."""

    def __init__(self, cloud: str, base: str,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if cloud not in DEFAULT_METADATA:
            raise ValueError(f"unknown cloud {cloud!r}")
        self.cloud, self.base, self.clock = cloud, base.rstrip("/"), clock
        self._token, self._token_ends = "", 0.0
        self._vm_name = ""  # Azure: this VM's name, as Scheduled Events' `Resources` say it
        self.answered = False  # the service has answered once (Azure's events are enabled)

    @property
    def first_call_s(self) -> float:
        """How long the next call may take: Azure's first one, two minutes; else seconds."""
        return AZURE_FIRST_CALL_S if self.cloud == "azure" and not self.answered \
            else POLL_TIMEOUT_S

    def posted(self) -> bool:
        """True once the cloud has announced that this instance will be preempted."""
        try:
            posted = self._ask()
        except urllib.error.HTTPError as exc:
            if exc.code == 401 and self.cloud == "aws":  # the token expired early: a new one
                self._token_ends = 0.0
            if exc.code != 404:
                raise
            posted = False
        self.answered = True
        return posted

    def _ask(self) -> bool:
        base = self.base
        if self.cloud == "aws":  # 404 until a spot notice exists
            _get(f"{base}/latest/meta-data/spot/instance-action",
                 {"X-aws-ec2-metadata-token": self._aws_token()})
            return True
        if self.cloud == "gcp":
            google = {"Metadata-Flavor": "Google"}
            body = _get(f"{base}/computeMetadata/v1/instance/preempted", google)
            if body.strip().upper() == "TRUE":
                return True
            coming = _get(f"{base}/computeMetadata/v1/instance/maintenance-event", google)
            return coming.strip().upper() not in ("", GCP_NO_MAINTENANCE)
        headers = {"Metadata": "true"}
        body = _get(f"{base}/metadata/scheduledevents?{AZURE_API}", headers,
                    timeout=self.first_call_s)
        if not self._vm_name:
            self._vm_name = _get(f"{base}/metadata/instance/compute/name?api-version=2021-02-01"
                                 "&format=text", headers).strip()
        return any(event.get("EventType") in AZURE_NOTICE_EVENTS
                   and self._vm_name in event.get("Resources", [])
                   for event in json.loads(body).get("Events", []))

    def _aws_token(self) -> str:
        now = self.clock()
        if not self._token or now >= self._token_ends:
            self._token = _get(f"{self.base}/latest/api/token",
                               {"X-aws-ec2-metadata-token-ttl-seconds": str(AWS_TOKEN_TTL_S)},
                               method="PUT")
            self._token_ends = now + AWS_TOKEN_TTL_S - AWS_TOKEN_RENEW_S
        return self._token


def next_wait(wait_s: float, poll_s: float, refused: bool) -> float:
    """The wait before the next poll: doubled (up to BACKOFF_MAX_S) after a 429, else the
    poll's own pace."""
    return min(max(wait_s, poll_s) * 2, BACKOFF_MAX_S) if refused else poll_s


def notice_posted(cloud: str, base: str) -> bool:
    """One reading, with nothing kept (a reader that polls keeps a `NoticeReader`)."""
    return NoticeReader(cloud, base).posted()
