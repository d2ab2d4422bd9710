"""Each cloud's preemption notice, read from a local stand-in for its metadata service."""

from __future__ import annotations

import pytest

from sortie.trainer.notices import notice_posted
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
