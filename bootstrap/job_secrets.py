"""A job's secrets on their way to a node: never on a command line, over the command channel's
stdin into a 0600 file of the run's directory that the job's shell reads and deletes."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import PurePosixPath

from invoke.runners import Result

from sortie.bootstrap.ssh_channel import run_with_input
from sortie.bootstrap.transport import NodeTransport


@dataclass(frozen=True)
class SecretsOverStdin:
    """Secrets for a remote command, never on a command line: the command's first line
    (`receive`) reads them from the SSH channel's stdin into ``path``, a file only this user
    can read; the job's shell sources and deletes it (`source`). They are read before anything
    that could end the command early: that would cut the channel under the sender."""

    values: dict[str, str]
    path: str  # on the node, in the run's directory

    def __bool__(self) -> bool:
        return bool(self.values)

    @property
    def receive(self) -> str:
        if not self.values:
            return ""
        parent, path = shlex.quote(str(PurePosixPath(self.path).parent)), shlex.quote(self.path)
        # No-clobber, no-follow: whatever is at the path (a link planted to catch them) is
        # removed, not written through; `set -C` then creates the file or fails.
        return (f"mkdir -p {parent} && rm -f {path} && (umask 077 && set -C && cat > {path}) "
                "|| exit 1\n")

    @property
    def source(self) -> str:
        return f". {shlex.quote(self.path)} && {self.discard}"

    @property
    def discard(self) -> str:
        return f"rm -f {shlex.quote(self.path)}"

    def stdin(self) -> bytes:
        """What the command reads: one `export NAME='value'` line per secret."""
        return "".join(f"export {name}={shlex.quote(value)}\n"
                       for name, value in self.values.items()).encode()

    def run(self, conn: NodeTransport, command: str, timeout: float | None = None) -> Result:
        """``command`` on the node, the secrets on its stdin (none: an ordinary `run`)."""
        if not self.values:
            return conn.run(command, timeout=timeout)
        return run_with_input(conn, command, self.stdin(), timeout)
