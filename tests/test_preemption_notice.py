"""Each cloud's preemption notice, read from a local stand-in for its metadata service."""

from __future__ import annotations

import pytest

from sortie.trainer.notices import (
    AWS_TOKEN_RENEW_S,
    AWS_TOKEN_TTL_S,
    AZURE_FIRST_CALL_S,
    BACKOFF_MAX_S,
    NoticeReader,
    next_wait,
    notice_posted,
)
from tests.helpers import CloudMetadata

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("cloud", ["aws", "gcp", "azure"])
def test_notice_is_read_with_each_clouds_protocol(cloud: str, metadata: str):
    assert notice_posted(cloud, metadata) is False
    CloudMetadata.preempted = True
    assert notice_posted(cloud, metadata) is True


def test_an_unreachable_metadata_service_is_an_error_not_a_notice():
    with pytest.raises(OSError):
        notice_posted("gcp", "http://127.0.0.1:9")  # discard port: nothing listens


def test_the_aws_session_token_is_kept_until_it_nearly_expires(metadata: str):
    now = [0.0]
    reader = NoticeReader("aws", metadata, clock=lambda: now[0])
    for _ in range(5):
        assert reader.posted() is False
    assert CloudMetadata.token_requests == 1  # one token for every poll, not one per poll
    now[0] = AWS_TOKEN_TTL_S - AWS_TOKEN_RENEW_S  # a minute before it ends: a new one
    assert reader.posted() is False
    assert CloudMetadata.token_requests == 2


def test_azures_first_call_is_allowed_its_documented_two_minutes(metadata: str):
    reader = NoticeReader("azure", metadata)
    assert reader.first_call_s == AZURE_FIRST_CALL_S == 120.0
    assert reader.posted() is False
    assert reader.first_call_s == 2.0  # enabled: later polls time out in seconds
    assert NoticeReader("aws", metadata).first_call_s == 2.0


def test_an_unknown_cloud_is_refused_before_any_call():
    with pytest.raises(ValueError, match="unknown cloud"):
        NoticeReader("oci", "http://127.0.0.1:9")


def test_a_coming_gcp_host_maintenance_is_a_notice(metadata: str):
    """A GPU VM is stopped for host maintenance (onHostMaintenance TERMINATE): the value of
    `maintenance-event` changes about a minute before (issue 64)."""
    assert notice_posted("gcp", metadata) is False
    CloudMetadata.maintenance = "TERMINATE_ON_HOST_MAINTENANCE"
    assert notice_posted("gcp", metadata) is True


@pytest.mark.parametrize("kind", ["Reboot", "Redeploy", "Freeze", "Terminate"])
def test_azure_events_that_stop_this_vm_are_notices_and_another_vms_are_not(metadata: str,
                                                                            kind: str):
    CloudMetadata.azure_events = [{"EventId": "x", "EventType": kind, "Resources": ["other-vm"]}]
    assert notice_posted("azure", metadata) is False, "another VM's event (its Resources)"
    CloudMetadata.azure_events = [{"EventId": "y", "EventType": kind,
                                   "Resources": [CloudMetadata.vm_name]}]
    assert notice_posted("azure", metadata) is True


def test_a_refusing_metadata_service_is_polled_less_until_it_answers(metadata: str):
    import urllib.error

    CloudMetadata.too_many = 1
    with pytest.raises(urllib.error.HTTPError) as refused:
        NoticeReader("azure", metadata).posted()
    assert refused.value.code == 429
    waits = [1.0]
    for refusal in (True, True, True, True, True, True, False):
        waits.append(next_wait(waits[-1], 1.0, refusal))
    assert waits == [1.0, 2.0, 4.0, 8.0, 16.0, BACKOFF_MAX_S, BACKOFF_MAX_S, 1.0]


def test_one_rank_per_node_polls_the_notice(monkeypatch: pytest.MonkeyPatch, metadata: str):
    """Eight ranks polling at 1 Hz came near Azure's 5 requests a second per VM; the flag the
    first rank reads reaches the others through the step's all-reduce (`agreed`)."""
    import signal

    from sortie.trainer.preempt import PreemptionWatch

    before = signal.getsignal(signal.SIGTERM)
    try:
        monkeypatch.setenv("LOCAL_RANK", "3")
        assert PreemptionWatch("azure", metadata).polls is False
        monkeypatch.setenv("LOCAL_RANK", "0")
        watch = PreemptionWatch("azure", metadata, poll_s=0.05)
        assert watch.polls is True
        watch.requested.set()  # its poll ends
    finally:
        signal.signal(signal.SIGTERM, before)


def test_every_rank_says_why_the_job_stopped_even_when_another_rank_was_told():
    """A SIGTERM reaches the nodes one after another: the rank it had not yet reached stops at
    the same step, and its marker says SIGTERM, not an unexplained "another rank"."""
    from sortie.trainer.preempt import NOTICE_CODE, SIGTERM_CODE, job_reason

    sigterm, notice = SIGTERM_CODE, NOTICE_CODE
    assert 0 < sigterm < notice  # MAX of the two: a notice says more than a signal
    assert job_reason(sigterm, 0, "none") == "SIGTERM (another rank)"
    assert job_reason(sigterm, sigterm, "none") == "SIGTERM"
    assert job_reason(max(sigterm, notice), sigterm, "aws") == \
        "aws preemption notice (another rank)"
    assert job_reason(notice, notice, "aws") == "aws preemption notice"
