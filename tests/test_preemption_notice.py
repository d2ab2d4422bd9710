"""Each cloud's preemption notice, read from a local stand-in for its metadata service."""

from __future__ import annotations

import http.server
import json
import threading

import pytest

from trainer.preempt import notice_posted


class CloudMetadata(http.server.BaseHTTPRequestHandler):
    """Answers like AWS IMDSv2, GCP's metadata server and Azure Scheduled Events, and checks the
    headers each one demands."""

    preempted = False

    def do_PUT(self) -> None:  # noqa: N802 - http.server's naming
        ok = self.path == "/latest/api/token" and self.headers.get(
            "X-aws-ec2-metadata-token-ttl-seconds")
        self._reply(200 if ok else 400, b"aws-token")

    def do_GET(self) -> None:  # noqa: N802
        if self.path == "/latest/meta-data/spot/instance-action":
            if self.headers.get("X-aws-ec2-metadata-token") != "aws-token":
                return self._reply(401, b"")
            return self._reply(200 if self.preempted else 404, b'{"action": "terminate"}')
        if self.path == "/computeMetadata/v1/instance/preempted":
            if self.headers.get("Metadata-Flavor") != "Google":
                return self._reply(403, b"")
            return self._reply(200, b"TRUE" if self.preempted else b"FALSE")
        if self.path == "/metadata/scheduledevents?api-version=2020-07-01":
            if self.headers.get("Metadata") != "true":
                return self._reply(400, b"")
            events = [{"EventId": "e1", "EventType": "Preempt"}] if self.preempted else [
                {"EventId": "e0", "EventType": "Freeze"}]
            return self._reply(200, json.dumps({"Events": events}).encode())
        return self._reply(404, b"")

    def _reply(self, code: int, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args) -> None:
        pass


@pytest.fixture
def metadata():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), CloudMetadata)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    CloudMetadata.preempted = False
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.mark.parametrize("cloud", ["aws", "gcp", "azure"])
def test_notice_is_read_with_each_clouds_protocol(cloud: str, metadata: str):
    assert notice_posted(cloud, metadata) is False
    CloudMetadata.preempted = True
    assert notice_posted(cloud, metadata) is True


def test_an_unreachable_metadata_service_is_an_error_not_a_notice():
    with pytest.raises(OSError):
        notice_posted("gcp", "http://127.0.0.1:9")  # discard port: nothing listens
