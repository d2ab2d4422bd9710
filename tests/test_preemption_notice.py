"""Each cloud's preemption notice, read from a local stand-in for its metadata service."""

from __future__ import annotations

import pytest

from sortie.trainer.notices import (
    AWS_TOKEN_RENEW_S,
    AWS_TOKEN_TTL_S,
    AZURE_FIRST_CALL_S,
    NoticeReader,
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
