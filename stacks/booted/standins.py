"""Stand-ins for a cloud's own services, inside one rehearsed node's network namespace: its
metadata service on http://169.254.169.254 and its secret store on https://169.254.169.254 (the
node resolves the store's names there), answering as `infra/<cloud>/rehearsal.py` says. One
process per node, started beside its relay and ending with its node, like the relay one of the
node's processes for `reclaim` and `down`.

What a rehearsal changes while a node runs is read on each request from the node's state: a spot
notice is posted once ``notice_file`` exists (`sortie rehearse preempt`); the secret store lets
the node read its secret only from ``grant_at`` on (the grant's propagation).

    python -m sortie.stacks.booted.standins --netns PATH --config FILE --while PID
"""

from __future__ import annotations

import argparse
import http.server
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
from pydantic import BaseModel

from sortie.infra.cloud_rehearsal import METADATA_ADDRESS, Answer, Asked, NodeSide, rehearsal
from sortie.stacks.booted.relay import POLL_S, enter_network_namespace
from sortie.stacks.machine.held_limits import tagged_env

MAX_BODY = 1 << 20  # a request's body (a secret's id in JSON): far less
METADATA_PORT, SECRETS_PORT = 80, 443


class StandinConfig(BaseModel):
    cloud: str
    side: dict  # NodeSide's fields
    tls_dir: Path
    notice_file: Path
    grant_at: float  # epoch seconds


def _handler(config: StandinConfig, side: NodeSide, secret_store: bool,
             lock: threading.Lock) -> type[http.server.BaseHTTPRequestHandler]:
    cloud = rehearsal(config.cloud)
    answer_with = cloud.secret_store if secret_store else cloud.metadata

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _answer(self) -> None:
            length = min(int(self.headers.get("Content-Length") or 0), MAX_BODY)
            asked = Asked(self.command, self.path,
                          {k.lower(): v for k, v in self.headers.items()},
                          self.rfile.read(length) if length else b"")
            with lock:  # (one node's state, several connections)
                side.notice = config.notice_file.exists()
                side.grant_ready = time.time() >= config.grant_at
                try:
                    answer = answer_with(asked, side)
                except Exception as exc:  # noqa: BLE001 - a stand-in's bug: a 500, not a hang
                    answer = Answer(500, f"stand-in error: {exc}".encode())
            self.send_response(answer.status)
            self.send_header("Content-Type", answer.content_type)
            self.send_header("Content-Length", str(len(answer.body)))
            self.end_headers()
            self.wfile.write(answer.body)

        do_GET = do_PUT = do_POST = _answer  # noqa: N815 - http.server's naming

        def log_message(self, *_args: object) -> None:
            pass

    return Handler


def serve(config: StandinConfig, node_pid: int) -> None:
    """Both stand-ins, until process ``node_pid`` (the node's container) ends."""
    side, lock = NodeSide(**{**config.side, "tokens": set()}), threading.Lock()
    metadata = http.server.ThreadingHTTPServer(
        (METADATA_ADDRESS, METADATA_PORT), _handler(config, side, False, lock))
    store = http.server.ThreadingHTTPServer(
        (METADATA_ADDRESS, SECRETS_PORT), _handler(config, side, True, lock))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(config.tls_dir / "server.pem", config.tls_dir / "server.key")
    store.socket = context.wrap_socket(store.socket, server_side=True)
    for server in (metadata, store):
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        node = psutil.Process(node_pid)
        while node.is_running() and node.status() != psutil.STATUS_ZOMBIE:
            time.sleep(POLL_S)
    except psutil.Error:
        return


def start_standins(netns: Path, config_file: Path, node_pid: int, tag: str) -> None:
    """Start a node's stand-ins, detached, in its namespace (where METADATA_ADDRESS is on
    ``lo``)."""
    with open(config_file.with_suffix(".log"), "ab") as log:
        subprocess.Popen(
            [sys.executable, "-m", "sortie.stacks.booted.standins", "--netns", str(netns),
             "--config", str(config_file), "--while", str(node_pid)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True, cwd="/",
            env=tagged_env(tag))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cloud_standins", description=__doc__.split("\n")[0])
    parser.add_argument("--netns", type=Path, required=True)
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--while", dest="node_pid", type=int, required=True)
    args = parser.parse_args(argv)
    config = StandinConfig.model_validate_json(args.config.read_text())
    enter_network_namespace(args.netns)
    serve(config, args.node_pid)
    return 0


if __name__ == "__main__":
    sys.exit(main())
