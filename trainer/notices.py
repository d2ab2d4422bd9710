"""Each cloud's preemption notice, as a node reads it from the cloud's metadata service: where it
is asked for and what says the machine will go. Plain HTTP, no torch: the trainer's flags
(`config.py`) name the clouds here. A new cloud with spot notices adds its reading here."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
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


def _get(url: str, headers: dict[str, str], method: str = "GET",
         timeout: float = POLL_TIMEOUT_S) -> str:
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
            body = _get(f"{base}/computeMetadata/v1/instance/preempted",
                        {"Metadata-Flavor": "Google"})
            return body.strip().upper() == "TRUE"
        body = _get(f"{base}/metadata/scheduledevents?api-version=2020-07-01",
                    {"Metadata": "true"}, timeout=self.first_call_s)
        return any(e.get("EventType") == "Preempt" for e in json.loads(body).get("Events", []))

    def _aws_token(self) -> str:
        now = self.clock()
        if not self._token or now >= self._token_ends:
            self._token = _get(f"{self.base}/latest/api/token",
                               {"X-aws-ec2-metadata-token-ttl-seconds": str(AWS_TOKEN_TTL_S)},
                               method="PUT")
            self._token_ends = now + AWS_TOKEN_TTL_S - AWS_TOKEN_RENEW_S
        return self._token


def notice_posted(cloud: str, base: str) -> bool:
    """One reading, with nothing kept (a reader that polls keeps a `NoticeReader`)."""
    return NoticeReader(cloud, base).posted()
