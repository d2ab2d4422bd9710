"""`sortie ssh` as people use ssh, and `sortie ssh-config` for the tools that use ssh themselves.

`sortie ssh [NAME] [NODE] [SSH OPTIONS] [-- COMMAND]`: the head node when no NODE is given; the
options of ssh's that forward ports or shape the session pass through (`-L 6006:localhost:6006
-N`), those that would undo the pinned host key, the identity or the user are refused, each
with its reason, in one line; a shell or a command starts where the job runs, with the job's
environment (`bootstrap/contract.py`'s variables that do not depend on a run, and the job's
own Python environment where it has one).

`sortie ssh-config NAME` writes OpenSSH `Host` entries (`NAME-node-0`, ...) that trust only the
cluster's pinned keys, in the cluster's own known_hosts file (never `StrictHostKeyChecking
no`), so `ssh`, `scp`, `rsync` and editors' remote plugins reach a node; `--write` keeps them
in a marked block of ``~/.ssh/config``, replaced whole each time and removed by `--remove`.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from sortie.bootstrap import ssh
from sortie.bootstrap.contract import place_environment
from sortie.bootstrap.job_env import activation, job_python
from sortie.bootstrap.node_layout import job_dir
from sortie.bootstrap.srun import step_command
from sortie.core import statefile
from sortie.core.errors import UsageError
from sortie.core.inventory import Inventory, LoginHost, Node

NODE_NAME = re.compile(r"node-\d+")

# ssh's options that pass through, with whether each takes a value.
PASSED = {"-L": True, "-R": True, "-D": True, "-W": True, "-E": True, "-b": True, "-c": True,
          "-m": True, "-e": True, "-N": False, "-T": False, "-t": False, "-q": False,
          "-v": False, "-C": False, "-f": False, "-n": False, "-x": False, "-X": False,
          "-g": False, "-4": False, "-6": False}
# ...and those that do not, each with why.
REFUSED = {
    "-o": "an option given this way could turn the pinned host key check off",
    "-F": "another config file could turn the pinned host key check off",
    "-J": "a jump host is reached without its host key pinned",
    "-i": "sortie logs in with the cluster's own key",
    "-l": "sortie logs in as the cluster's user",
    "-p": "sortie knows the node's port",
    "-S": "a shared connection skips the host key check",
    "-M": "a shared connection skips the host key check",
    "-A": "forwarding your agent lets whoever is root on the node use your keys "
          "(`sortie ssh-config` writes entries for your own ssh, where that is your call)",
    "-Y": "trusted X11 forwarding lets the node reach your display unchecked (-X is allowed)",
}


@dataclass(frozen=True)
class SshWords:
    """`sortie ssh`'s words, read: which sortie and node, ssh's options, the command."""

    name: str | None
    node: str | None  # None: the head node
    options: tuple[str, ...]
    command: tuple[str, ...]


def read_words(words: tuple[str, ...]) -> SshWords:
    """``[NAME] [NODE] [OPTIONS] [-- COMMAND]``; a word after the options that is no option
    starts the command too (`sortie ssh dev node-1 ls -la`)."""
    words, command = _split_command(words)
    name = node = None
    if words and not words[0].startswith("-") and not NODE_NAME.fullmatch(words[0]):
        name, words = words[0], words[1:]
    if words and NODE_NAME.fullmatch(words[0]):
        node, words = words[0], words[1:]
    options: list[str] = []
    while words:
        word = words[0]
        flag = word[:2]
        if not word.startswith("-"):
            return SshWords(name, node, tuple(options), (*words, *command))
        if flag in REFUSED:
            raise UsageError(f"{flag}: not passed to ssh: {REFUSED[flag]}")
        if flag not in PASSED:
            raise UsageError(f"{word}: not an ssh option sortie passes on (these are: "
                             f"{' '.join(PASSED)})")
        takes = PASSED[flag]
        if takes and len(word) == 2:
            if len(words) < 2:
                raise UsageError(f"{flag}: needs a value, e.g. `{flag} 6006:localhost:6006`"
                                 if flag == "-L" else f"{flag}: needs a value")
            options += [word, words[1]]
            words = words[2:]
        else:
            if not takes and len(word) > 2 and set(word[1:]) != {word[1]}:  # -Nf: one at a time
                raise UsageError(f"{word}: give ssh's flags one by one (`-N -f`)")
            options.append(word)
            words = words[1:]
    return SshWords(name, node, tuple(options), command)


def _split_command(words: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    if "--" in words:
        at = words.index("--")
        return words[:at], words[at + 1:]
    return words, ()


def session_environment(inventory: Inventory, node: Node) -> str:
    """``export`` of the job's variables that hold for any run on ``node`` (its rank, the
    head's address, the workdir), and its own Python environment where it has one."""
    env = {**inventory.train_env,
           **place_environment(inventory, node, workdir=job_dir(node),
                               python=job_python(node, inventory))}
    own = activation(node, inventory)
    return f"export {ssh.shell_env(env)}{' ' + own if own else ''}"


def ssh_command(inventory: Inventory, known_hosts: Path, words: SshWords) -> list[str]:
    """The `ssh` command line into the node ``words`` name (the head by default), trusting only
    its pinned host key; a Slurm node's `srun` step (ssh's options do not apply there)."""
    try:
        target = inventory.node(words.node) if words.node else inventory.head
    except KeyError as exc:
        raise UsageError(f"NODE: {exc.args[0]}") from None
    command, options = words.command, words.options
    # A shell or a command, where the job runs ($SORTIE_WORKDIR), else in sortie's workdir.
    # The command's words are joined as ssh itself joins them for the remote shell.
    where = f"cd {shlex.quote(job_dir(target))} 2>/dev/null || cd {shlex.quote(target.workdir)}"
    prelude = f"{session_environment(inventory, target)}; {where}"
    shell = f"{prelude}; {' '.join(command)}" if command else \
        f'{prelude}; exec "${{SHELL:-/bin/sh}}" -l'
    if target.srun is not None:  # a Slurm node: a step in its allocation (a terminal: --pty)
        if options:
            raise UsageError(f"{options[0]}: a Slurm node is reached with `srun`, not ssh: "
                             "ssh's options do not apply")
        step = step_command(target.srun, shell)
        step = [*step[:1], *([] if command else ["--pty"]), *step[1:]]
        login = target.srun.login
        if login is None:
            return step
        return ["ssh", *ssh.openssh_args(login, known_hosts), "-o", "LogLevel=ERROR",
                *([] if command else ["-t"]), "--", login.address, shlex.join(step)]
    pinned = [*ssh.openssh_args(target, known_hosts), "-o", "LogLevel=ERROR"]
    if "-N" in options:  # forwarding only: no remote command, no terminal
        return ["ssh", *pinned, *options, "--", target.address]
    terminal = [] if command or {"-T", "-t"} & set(options) else ["-t"]
    return ["ssh", *pinned, *terminal, *options, "--", target.address, shell]


BEGIN, END = "# >>> sortie {name} >>>", "# <<< sortie {name} <<<"


def host_entries(name: str, inventory: Inventory, known_hosts: Path) -> str:
    """OpenSSH `Host NAME-node-N` entries for every node reached over SSH (a Slurm site's:
    `NAME-login`, its login node), pinned to the cluster's own known_hosts file; its key and
    user as the cluster's."""
    lines = [BEGIN.format(name=name),
             f"# written by `sortie ssh-config {name}`: each node's host key is pinned in "
             f"{known_hosts}"]
    hosts: dict[str, Node | LoginHost] = {node.name: node for node in inventory.nodes
                                          if node.srun is None}
    login = next((node.srun.login for node in inventory.nodes if node.srun and node.srun.login),
                 None)
    if login is not None:  # a Slurm site: its login node (one for the allocation)
        hosts["login"] = login
    if not hosts:
        raise UsageError(f"NAME: {name}'s nodes are reached with `srun` on this machine, not "
                         "over SSH: `sortie ssh` reaches them")
    for label, host in hosts.items():
        lines += [f"Host {name}-{label}",
                  f"    HostName {host.address}",
                  f"    Port {host.port}",
                  f"    User {host.user}",
                  f"    IdentityFile {ssh.ssh_path(host.key_path)}",
                  "    IdentitiesOnly yes",
                  f"    UserKnownHostsFile {ssh.ssh_path(known_hosts)}",
                  "    GlobalKnownHostsFile /dev/null",
                  "    StrictHostKeyChecking yes",
                  "    UpdateHostKeys no",
                  "    ControlMaster no",
                  "    ControlPath none"]
    lines.append(END.format(name=name))
    return "\n".join(lines) + "\n"


def with_entries(config: str, name: str, entries: str | None) -> str:
    """``config`` (a ~/.ssh/config's text) with cluster NAME's marked block replaced by
    ``entries`` (None: removed); the rest of the file as it was. A sortie block goes first:
    OpenSSH takes the first value it reads for each option, and a `Host *` further down must
    not override the pinned key file."""
    begin, end = BEGIN.format(name=name), END.format(name=name)
    lines = config.splitlines(keepends=True)
    if any(line.rstrip("\n") == begin for line in lines):
        start = next(i for i, line in enumerate(lines) if line.rstrip("\n") == begin)
        stop = next((i for i, line in enumerate(lines[start:], start)
                     if line.rstrip("\n") == end), None)
        if stop is None:
            raise UsageError(f"~/.ssh/config: the block `{begin}` has no end line `{end}`; "
                             "mend or remove it by hand")
        del lines[start:stop + 1]
    rest = "".join(lines)
    return (entries + ("\n" if rest and entries else "") if entries else "") + rest


def write_entries(config: Path, name: str, entries: str | None) -> None:
    """Keep ``entries`` in ``config`` (made 0600, in a 0700 directory, when new)."""
    config.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        text = statefile.read_regular(config, 1 << 20, follow_symlinks=True).decode() \
            if config.exists() else ""
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{config}: cannot be read ({exc})") from None
    mode = config.stat().st_mode & 0o777 if config.exists() else 0o600
    statefile.write_text(config.resolve(), with_entries(text, name, entries), mode)
