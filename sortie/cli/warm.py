"""A warm `sortie`: a process of this user that has loaded sortie's modules once and forks a copy
of itself for each command, so that a command starts in milliseconds, not in the ~0.3 s that
loading them takes (`sortie exec` runs again and again while a researcher iterates).

The `sortie` executable (`sortie/cli/start.py`) first asks the warm process for this user, this
Python and this exact source tree (`socket_path`) to run the command: it sends the command's
arguments, working directory, environment and umask, and its stdin, stdout and stderr (the file
descriptors themselves: the command writes to the same terminal or pipe), then waits for the exit
status, which the warm process reads from the command's process when it ends. Signals the
`sortie` process gets (Ctrl-C, SIGTERM, SIGHUP, SIGQUIT, SIGABRT) go on to the command's; a
command whose `sortie` process was killed (SIGKILL) is killed too, as it would have been in that
process. `sortie ssh`, interactive over a terminal of its own, always runs in the `sortie`
process. Where no warm process runs yet, the command runs as before and one is started beside it
for the next command; it leaves after IDLE_S without one. ``SORTIE_WARM=0`` turns all of this
off.

Only this user reaches it: the socket lies in a directory only this user can enter
(``$XDG_RUNTIME_DIR/sortie`` or ``/tmp/sortie-<uid>``), and every caller's uid is checked.
This module imports only the standard library until it serves: the `sortie` process pays for
nothing else.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import stat
import struct
import sys
from pathlib import Path

WARM_ENV = "SORTIE_WARM"
HERE_ONLY = {"ssh"}  # interactive over a terminal of its own: run in the `sortie` process
IDLE_S = 900.0  # a warm process leaves after this long without a command
PACKAGES = ("sortie", "bootstrap", "stacks", "infra", "trainer")  # what it loaded
MAX_REQUEST = 4 << 20  # bytes: arguments and environment
MAX_SOCKET_PATH = 107  # bytes: a Unix socket's address holds no longer path (Linux: 108, NUL)
LENGTH = struct.Struct("!I")  # of a request, before it
NUMBER = struct.Struct("!i")  # what comes back: the command's pid, then its exit status


def socket_path() -> Path | None:
    """Where the warm process for this user, Python and source tree listens; None where no
    private directory can be had (then nothing is warm)."""
    base = os.environ.get("XDG_RUNTIME_DIR")
    directory = Path(base) / "sortie" if base else Path(f"/tmp/sortie-{os.getuid()}")
    try:
        directory.mkdir(mode=0o700, exist_ok=True)
        found = os.lstat(directory)
    except OSError:
        return None
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.getuid() or found.st_mode & 0o077:
        return None  # not ours alone (made by someone else, or opened up): never used
    path = directory / f"{_fingerprint()}.sock"
    return path if len(os.fsencode(path)) <= MAX_SOCKET_PATH else None


def _fingerprint() -> str:
    """This Python, its import path and every file of sortie's packages (name, size, time):
    a change to any (an upgrade, an edit in a checkout) is another warm process. The path's
    first entry (the script's folder, or the working directory of `python -m`) is left out:
    where sortie's packages come from is in the files' names."""
    root = Path(__file__).resolve().parent.parent.parent
    digest = hashlib.sha256(f"{sys.executable}\0{os.pathsep.join(sys.path[1:])}".encode())
    for package in PACKAGES:
        for folder, dirs, files in os.walk(root / package):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in sorted(files):
                found = os.stat(os.path.join(folder, name))
                digest.update(f"{folder}/{name}\0{found.st_size}\0{found.st_mtime_ns}\0".encode())
    return digest.hexdigest()[:24]


# -- the `sortie` process ----------------------------------------------------------------------

def run_warm(argv: list[str]) -> int | None:
    """Run the command in a warm process; its exit status, or None where it must run here (no
    warm process yet: one is started for the next command)."""
    if os.environ.get(WARM_ENV) == "0" or HERE_ONLY & set(argv) or None in (
            sys.stdin, sys.stdout, sys.stderr):
        return None
    path = socket_path()
    if path is None:
        return None
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        client.connect(str(path))
    except OSError:
        client.close()
        _start_warm(path)
        return None
    import signal

    with client:
        mask = os.umask(0o077)
        os.umask(mask)
        request = json.dumps({
            "argv": argv, "cwd": os.getcwd(), "env": dict(os.environ), "umask": mask,
            # A shell starts background jobs with Ctrl-C ignored: so is the command then.
            "sigint_ignored": signal.getsignal(signal.SIGINT) is signal.SIG_IGN,
            "streams": [[s.encoding, s.errors, s.line_buffering, s.write_through]
                        for s in (sys.stdin, sys.stdout, sys.stderr)]}).encode()
        try:
            socket.send_fds(client, [LENGTH.pack(len(request)) + request], [0, 1, 2])
            pid = _read_int(client)
        except OSError:
            pid = None
        if pid is None:  # it went away before starting the command: run it here
            return None

        def forward(signum: int, _frame: object) -> None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)

        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT,
                       signal.SIGABRT):
            if signal.getsignal(signum) is not signal.SIG_IGN:
                signal.signal(signum, forward)
        status = _read_int(client)
    if status is None:
        print("sortie: error: the warm process ended before the command did "
              f"(set {WARM_ENV}=0 to run commands without it)", file=sys.stderr)
        return 1
    return status


def _read_int(conn: socket.socket) -> int | None:
    data = b""
    while len(data) < NUMBER.size:
        chunk = conn.recv(NUMBER.size - len(data))  # retried by Python on a signal (PEP 475)
        if not chunk:
            return None
        data += chunk
    return NUMBER.unpack(data)[0]


def _start_warm(path: Path) -> None:
    """A warm process for ``path``, detached from this one; what it needs of the environment
    only (it takes each command's own), so that it names no sortie home of any command."""
    import subprocess

    env = {k: v for k, v in os.environ.items() if not k.startswith("SORTIE_")}
    with contextlib.suppress(OSError):  # none: commands run as before
        subprocess.Popen([sys.executable, "-m", "sortie.cli.warm", str(path)], env=env,
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True, cwd="/")


# -- the warm process ---------------------------------------------------------------------------

def serve(path: Path) -> None:
    """Load sortie's modules, then run each command that arrives on ``path`` in a forked copy
    of this process, until IDLE_S passes without one."""
    import fcntl
    import gc
    import importlib
    import select
    import signal

    if socket_path() != path:
        return  # another Python or source tree than the caller's: its socket, not ours
    lock = os.fdopen(os.open(f"{path}.lock", os.O_WRONLY | os.O_CREAT, 0o600), "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return  # another warm process serves it
    gc.disable()
    from sortie.cli import app

    for module, _ in set(app.COMMANDS.values()):
        importlib.import_module(f"sortie.cli.{module}")
    gc.freeze()
    gc.enable()
    with open(os.devnull) as null:
        os.dup2(null.fileno(), 0)
    path.unlink(missing_ok=True)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    os.chmod(path, 0o600)
    server.listen(32)
    # A child's end wakes the loop (its status goes to its caller at once).
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    callers: dict[int, socket.socket] = {}  # command's pid -> its caller's connection
    try:
        while True:
            ready, _, _ = select.select([server, wake_read], [], [],
                                        None if callers else IDLE_S)
            if not ready:
                return  # idle
            if wake_read in ready:
                os.read(wake_read, 512)
                _report_ended(callers)
            if server in ready:
                conn, _ = server.accept()
                uid = struct.unpack("3i", conn.getsockopt(
                    socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))[1]
                if uid != os.getuid():
                    conn.close()
                    continue
                pid = os.fork()
                if pid == 0:  # the command's process: it never returns into this loop
                    code = 70
                    try:
                        for fd in (server.fileno(), lock.fileno(), wake_read, wake_write):
                            os.close(fd)
                        code = _command(conn, app)
                    finally:
                        os._exit(code)
                callers[pid] = conn
    finally:
        with contextlib.suppress(OSError):
            if os.lstat(path).st_ino == os.fstat(server.fileno()).st_ino:
                path.unlink()


def _report_ended(callers: dict[int, socket.socket]) -> None:
    """Tell each ended command's caller its exit status (as a shell would: 128+N for signal N)."""
    while callers:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            return
        conn = callers.pop(pid, None)
        if conn is not None:
            code = os.waitstatus_to_exitcode(status)
            with contextlib.suppress(OSError):  # its caller may be gone
                conn.sendall(NUMBER.pack(code if code >= 0 else 128 - code))
            conn.close()


def _command(conn: socket.socket, app: object) -> int:
    """In the forked process: become the caller's command and run it; its exit status."""
    import atexit
    import signal
    import threading

    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    os.setsid()  # its own group: a signal for it never reaches the warm process
    try:
        message, fds, _flags, _address = socket.recv_fds(conn, 1 << 16, 3)
        size = LENGTH.unpack(message[:LENGTH.size])[0]
        if size > MAX_REQUEST or len(fds) != 3:
            return 2
        body = message[LENGTH.size:]
        while len(body) < size:
            chunk = conn.recv(min(1 << 16, size - len(body)))
            if not chunk:
                return 2
            body += chunk
        request = json.loads(body)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.umask(int(request["umask"]))
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        _open_streams(request["streams"])
        signal.signal(signal.SIGINT, signal.SIG_IGN if request["sigint_ignored"] else
                      signal.default_int_handler)
        if os.environ.get("PYTHONFAULTHANDLER"):  # as that Python would have at its start
            import faulthandler

            faulthandler.enable()
        conn.sendall(NUMBER.pack(os.getpid()))
    except (OSError, ValueError, KeyError, TypeError):
        return 2

    def caller_gone() -> None:
        """The `sortie` process ended before the command (SIGKILL: signals it can catch, it
        passes on): so does the command, as it would have in that process."""
        try:
            while conn.recv(1 << 10):
                pass
        except OSError:
            pass
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=caller_gone, daemon=True, name="sortie-caller").start()
    sys.argv = ["sortie", *request["argv"]]
    code = 0
    try:
        app.entry()  # type: ignore[attr-defined]
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    atexit._run_exitfuncs()  # as the interpreter would at its end
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    return code


def _open_streams(streams: list[list]) -> None:
    """stdin, stdout and stderr over the caller's descriptors, encoded and buffered as its."""
    opened = []
    for fd, (encoding, errors, line_buffering, write_through) in enumerate(streams):
        stream = open(fd, "r" if fd == 0 else "w", encoding=encoding, errors=errors,  # noqa: SIM115
                      closefd=False)
        if fd:
            stream.reconfigure(line_buffering=line_buffering, write_through=write_through)
        opened.append(stream)
    sys.stdin, sys.stdout, sys.stderr = opened
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = opened


if __name__ == "__main__":
    serve(Path(sys.argv[1]))
