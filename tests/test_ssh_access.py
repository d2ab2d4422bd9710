"""Issue 66 (3): `sortie ssh` as people use ssh (the head by default, ssh's own options by rule,
the job's environment) and `sortie ssh-config` (pinned entries for ssh's own tools)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sortie.core.errors import UsageError
from sortie.core.inventory import Inventory, Node
from sortie.fleet import ssh_access
from sortie.fleet.ssh_access import SshWords, read_words

pytestmark = pytest.mark.unit


def node(index: int) -> Node:
    return Node(name=f"node-{index}", address=f"203.0.113.{index + 9}", port=2200 + index,
                user="u", key_path=Path("/k/id"), host_key="ssh-ed25519 AAAA", gpus=8,
                private_address=f"10.0.0.{index + 5}", workdir="/w")


INVENTORY = Inventory(cluster_id="dev", backend="local", nodes=[node(0), node(1)],
                      rdzv_port=29400)


@pytest.mark.parametrize(("words", "read"), [
    ((), SshWords(None, None, (), ())),
    (("dev",), SshWords("dev", None, (), ())),
    (("node-1",), SshWords(None, "node-1", (), ())),
    (("dev", "node-1", "--", "ls", "-la"), SshWords("dev", "node-1", (), ("ls", "-la"))),
    (("dev", "node-1", "ls", "-la"), SshWords("dev", "node-1", (), ("ls", "-la"))),
    (("dev", "-L", "6006:localhost:6006", "-N"),
     SshWords("dev", None, ("-L", "6006:localhost:6006", "-N"), ())),
    (("-L6006:localhost:6006", "-vvv", "--", "nvidia-smi"),
     SshWords(None, None, ("-L6006:localhost:6006", "-vvv"), ("nvidia-smi",))),
    (("dev", "node-0", "-X", "-C", "xclock"), SshWords("dev", "node-0", ("-X", "-C"), ("xclock",))),
])
def test_words_are_read_as_name_node_ssh_options_and_command(words, read):
    assert read_words(words) == read


@pytest.mark.parametrize(("words", "said"), [
    (("dev", "-oProxyCommand=sh -c 'touch pwned'"), "-o: not passed to ssh: an option given"),
    (("-o", "StrictHostKeyChecking=no"), "-o: not passed to ssh"),
    (("dev", "-A"), "-A: not passed to ssh: forwarding your agent"),
    (("dev", "-Y"), "-Y: not passed to ssh: trusted X11"),
    (("dev", "-J", "bastion"), "-J: not passed to ssh: a jump host"),
    (("dev", "-i", "key"), "-i: not passed to ssh"),
    (("dev", "-S", "/tmp/sock"), "-S: not passed to ssh: a shared connection"),
    (("dev", "--bogus"), "--bogus: not an ssh option sortie passes on"),
    (("dev", "-Z"), "-Z: not an ssh option sortie passes on"),
    (("dev", "-NA"), "-NA: give ssh's flags one by one"),
    (("dev", "-L"), "-L: needs a value, e.g. `-L 6006:localhost:6006`"),
])
def test_options_that_would_bypass_the_pinned_key_or_leak_are_refused_in_one_line(words, said):
    with pytest.raises(UsageError) as refused:
        read_words(words)
    assert str(refused.value).startswith(said)
    assert "\n" not in str(refused.value)


def test_the_command_goes_to_the_head_with_the_pinned_key_and_the_jobs_environment():
    known = Path("/home/u/.sortie/clusters/dev/known_hosts")
    argv = ssh_access.ssh_command(INVENTORY, known, read_words(("dev",)))
    assert argv[:3] == ["ssh", "-i", "/k/id"] and "StrictHostKeyChecking=yes" in argv
    assert f'UserKnownHostsFile="{known}"' in argv and "-t" in argv
    host, shell = argv[argv.index("--") + 1:]
    assert host == "203.0.113.9", "node-0, the head"
    assert shell.startswith("export ") and "SORTIE_NODE_RANK=0" in shell
    assert "MASTER_ADDR=10.0.0.5" in shell and "MASTER_PORT=29400" in shell
    assert "SORTIE_NUM_NODES=2" in shell and shell.endswith('exec "${SHELL:-/bin/sh}" -l')

    argv = ssh_access.ssh_command(INVENTORY, known, read_words(("dev", "node-1", "--", "env")))
    host, shell = argv[argv.index("--") + 1:]
    assert host == "203.0.113.10" and "SORTIE_NODE_RANK=1" in shell and shell.endswith("; env")
    assert "-t" not in argv, "a command gets no terminal unless asked"

    forward = ssh_access.ssh_command(INVENTORY, known,
                                     read_words(("dev", "-L", "6006:localhost:6006", "-N")))
    at = forward.index("--")
    assert forward[at - 3:] == ["-L", "6006:localhost:6006", "-N", "--", "203.0.113.9"], \
        "forwarding only: no remote command"
    assert forward.index("StrictHostKeyChecking=yes") < forward.index("-L"), "ours come first"

    with pytest.raises(UsageError, match="^NODE: no node named 'node-7'"):
        ssh_access.ssh_command(INVENTORY, known, read_words(("dev", "node-7")))


def test_ssh_config_entries_pin_each_nodes_key_and_never_turn_the_check_off():
    entries = ssh_access.host_entries("dev", INVENTORY, Path("/s/known_hosts"))
    assert entries.startswith("# >>> sortie dev >>>\n") and entries.endswith(
        "# <<< sortie dev <<<\n")
    assert entries.count("\nHost ") == 2 and "Host dev-node-1\n" in entries
    assert "    HostName 203.0.113.10\n    Port 2201\n    User u\n" in entries
    assert entries.count('UserKnownHostsFile "/s/known_hosts"') == 2
    assert entries.count("StrictHostKeyChecking yes") == 2 and " no\n" not in entries.replace(
        "UpdateHostKeys no", "").replace("ControlMaster no", "")


def test_the_config_block_is_replaced_whole_first_in_the_file_and_removed(tmp_path: Path):
    config = tmp_path / ".ssh" / "config"
    config.parent.mkdir(mode=0o700)
    config.write_text("Host *\n    ServerAliveInterval 30\n")
    config.chmod(0o600)
    first = ssh_access.host_entries("dev", INVENTORY, Path("/s/kh"))
    ssh_access.write_entries(config, "dev", first)
    assert config.read_text() == first + "\nHost *\n    ServerAliveInterval 30\n"
    assert config.stat().st_mode & 0o777 == 0o600
    smaller = ssh_access.host_entries(
        "dev", Inventory(cluster_id="dev", backend="local", nodes=[node(0)]), Path("/s/kh"))
    ssh_access.write_entries(config, "dev", smaller)  # again: one block, the new one
    assert config.read_text().count("# >>> sortie dev >>>") == 1
    assert "dev-node-1" not in config.read_text() and "dev-node-0" in config.read_text()
    ssh_access.write_entries(config, "other", ssh_access.host_entries(
        "other", INVENTORY, Path("/s/kh2")))
    ssh_access.write_entries(config, "dev", None)
    text = config.read_text()
    assert "sortie dev" not in text and "Host other-node-0" in text
    assert text.endswith("Host *\n    ServerAliveInterval 30\n"), "the user's own lines kept"
    broken = tmp_path / "broken"
    broken.write_text("# >>> sortie dev >>>\nHost dev-node-0\n")
    with pytest.raises(UsageError, match="has no end line"):
        ssh_access.write_entries(broken, "dev", None)
    fresh = tmp_path / "new" / ".ssh" / "config"
    ssh_access.write_entries(fresh, "dev", first)
    assert fresh.stat().st_mode & 0o777 == 0o600
    assert fresh.parent.stat().st_mode & 0o777 == 0o700
