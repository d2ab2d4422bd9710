"""A profile's SSH sources must be able to hold this controller: the shipped placeholder (a
documentation address) and a list without this machine's egress address are refused in one
line, with the fix, before anything is created; `plan` says so."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from sortie.infra.spec import placeholder_sources
from sortie.stacks.cloud.ssh_sources import egress_address
from sortie.stacks.profiles import PROFILES_DIR, load_profile
from tests.helpers import cli

pytestmark = pytest.mark.unit

NO_CLOUD = {"PATH": "/usr/bin:/bin", "AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": "",
            "AWS_PROFILE": "", "AWS_EC2_METADATA_DISABLED": "true"}


def test_documentation_ranges_are_placeholders_and_real_networks_are_not():
    assert placeholder_sources(["198.51.100.7/32", "10.0.0.0/8", "203.0.113.0/25",
                                "192.0.2.1/32", "2001:db8::1/128", "100.64.0.0/10"]) == [
        "198.51.100.7/32", "203.0.113.0/25", "192.0.2.1/32", "2001:db8::1/128"]
    assert placeholder_sources(["198.0.0.0/8"]) == []  # holds the range, and much besides


def test_every_shipped_profile_carries_the_placeholder_plan_warns_of():
    for path in PROFILES_DIR.glob("Pulumi.*.yaml"):
        name = path.name.removeprefix("Pulumi.").removesuffix(".yaml")
        assert placeholder_sources(load_profile(name)["sortie:sshAllowedCidrs"]), name


@pytest.mark.parametrize("command", [("run",), ("up",), ("run", "--nodes", "1")])
def test_the_placeholder_is_refused_before_anything_is_created(tmp_path: Path,
                                                               command: tuple[str, ...]):
    home = tmp_path / "home"
    result = cli(*command, "--stack", "aws-p4d", cwd=tmp_path,
                    env={**NO_CLOUD, "SORTIE_HOME": str(home)})
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("sortie: error: sortie:sshAllowedCidrs: 198.51.100.7/32 is a "
                                    "documentation address (RFC 5737)")
    assert "--set sshAllowedCidrs=$(curl -s https://checkip.amazonaws.com)/32" in result.stderr
    assert not home.exists(), "nothing was created"


def test_plan_says_the_placeholder_will_be_refused(tmp_path: Path):
    shown = cli("plan", "--stack", "gcp-a2", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "198.51.100.7/32 is a documentation address (RFC 5737)" in shown.stdout
    assert "`sortie run` and `sortie up` refuse it" in shown.stdout
    planned = json.loads(cli("plan", "--stack", "gcp-a2", "--json", cwd=tmp_path).stdout)
    assert planned["security"]["placeholder_ssh"] == ["198.51.100.7/32"]
    mine = json.loads(cli("plan", "--stack", "gcp-a2", "--json", "--set",
                          "sshAllowedCidrs=[100.64.7.0/24]", cwd=tmp_path).stdout)
    assert mine["security"]["placeholder_ssh"] == []


class _Egress(http.server.BaseHTTPRequestHandler):
    """Answers as checkip.amazonaws.com does: the caller's address and a newline."""

    address = "100.65.1.2"

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        body = f"{self.address}\n".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args) -> None:
        pass


@pytest.fixture
def egress() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Egress)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()


def test_sources_without_this_machines_address_are_refused(tmp_path: Path, egress: str,
                                                           own_profiles: Path):
    env = {**NO_CLOUD, "SORTIE_HOME": str(tmp_path / "home"), "SORTIE_EGRESS_URL": egress}
    _Egress.address = "100.65.1.2"  # outside the profile's 100.64.7.0/24
    refused = cli("run", "--stack", "aws-p4d", cwd=tmp_path, env=env)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert refused.stderr.startswith(
        "sortie: error: sortie:sshAllowedCidrs: this machine reaches the internet as "
        f"100.65.1.2 (per {egress}), which none of 100.64.7.0/24 holds"), refused.stderr
    assert "--set sshAllowedCidrs=100.65.1.2/32" in refused.stderr
    _Egress.address = "100.64.7.9"  # inside: on to the next check (no Pulumi CLI here)
    egress_address.cache_clear()  # (a process asks once; this one runs both commands)
    passed = cli("run", "--stack", "aws-p4d", cwd=tmp_path, env=env)
    assert passed.returncode == 2 and "the Pulumi CLI is not on PATH" in passed.stderr
    assert not (tmp_path / "home").exists(), "nothing was created"


def test_an_egress_lookup_that_fails_is_said_not_fatal(tmp_path: Path, own_profiles: Path):
    env = {**NO_CLOUD, "SORTIE_HOME": str(tmp_path / "home"),
           "SORTIE_EGRESS_URL": "http://127.0.0.1:9/"}  # discard port: nothing answers
    result = cli("run", "--stack", "aws-p4d", cwd=tmp_path, env=env)
    assert result.returncode == 2 and "the Pulumi CLI is not on PATH" in result.stderr


def test_gpu_sites_from_placeholder_profiles_are_refused_in_one_line(tmp_path: Path):
    """`run --gpu` builds its sites from the clouds' shipped profiles: with their placeholder,
    no site can be reached, and the one line says why for each cloud."""
    home = tmp_path / "home"
    result = cli("run", "--gpu", "A100:8", cwd=tmp_path,
                    env={**NO_CLOUD, "SORTIE_HOME": str(home)})
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("sortie: error: --gpu A100:8: no cloud can launch it: ")
    # One reason, once, for the three clouds it stops; its fix (--set) works with --gpu.
    clouds, _, why = result.stderr.partition(": sortie:sshAllowedCidrs: ")
    assert all(f"{cloud} (profile {profile})" in clouds for cloud, profile in (
        ("aws", "aws-p4d"), ("gcp", "gcp-a2"), ("azure", "azure-nd96"))), result.stderr
    assert why.startswith("198.51.100.7/32 is a documentation address"), result.stderr
    assert result.stderr.count("198.51.100.7") == 1 and \
        result.stderr.count("nothing was created") == 1, result.stderr
    fixed = cli("run", "--gpu", "A100:8", "--set", "sshAllowedCidrs=[100.64.7.9/32]",
                cwd=tmp_path, env={**NO_CLOUD, "SORTIE_HOME": str(home)})
    assert fixed.returncode == 2 and "the Pulumi CLI is not on PATH" in fixed.stderr and \
        "sshAllowedCidrs" not in fixed.stderr, fixed.stderr
    assert not (home / "stacks").exists(), "nothing was created"
