"""The real Pulumi: stacks driven through the Automation API and the Pulumi CLI.

`AutomationStacks` is the `StackStore` of a state backend (a local file backend by default, no
Pulumi Cloud account needed), `AutomationStack` one stack running `infra.program.main` inline,
secrets encrypted by passphrase. `InterruptiblePulumi` runs the CLI so that a Ctrl-C or SIGTERM
stops it cleanly instead of leaving it running.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pulumi.automation import PulumiCommand
from pulumi.automation._cmd import CommandResult
from pulumi.automation.errors import create_command_error

from sortie.core.errors import UsageError
from sortie.infra.spec import ClusterSpec
from sortie.stacks.cloud.stack_api import StackError, StackLockedError, StackResource
from sortie.stacks.records import RecordStore

PULUMI_INSTALL = "https://www.pulumi.com/docs/install/"
# "…/locks/organization/sortie/exp-1/<uuid>.json: created by ana@laptop (pid 4242) at …"
LOCK_HOLDER = re.compile(r"created by \S*?@(?P<host>\S+) \(pid (?P<pid>\d+)\)")


class InterruptiblePulumi(PulumiCommand):
    """The Pulumi CLI, stopped cleanly on Ctrl-C or SIGTERM.

    The Automation API's own runner, interrupted, waits 0.25 s and leaves the CLI running,
    holding the stack's lock halfway through its operations. Here the CLI runs in its own session
    (a Ctrl-C at the terminal does not reach it as well), and an interrupt is forwarded as one
    SIGINT, which Pulumi answers by finishing the operations in flight, saving the state and
    releasing the lock. It gets ``grace_s`` for that, then SIGTERM, then SIGKILL."""

    def __init__(self, command: str = "pulumi", grace_s: float = 120.0) -> None:
        root = str(Path(command).parent.parent) if os.sep in command else None
        super().__init__(root=root)
        self.grace_s = grace_s

    def run(self, args: list[str], cwd: str, additional_env: Mapping[str, str],
            on_output: Callable[[str], Any] | None = None,
            on_error: Callable[[str], Any] | None = None) -> CommandResult:
        argv = [self.command, *([] if "--non-interactive" in args else ["--non-interactive"]),
                *args]
        env = {**os.environ, **additional_env, "PULUMI_AUTOMATION_API": "true"}
        process = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   encoding="utf-8", start_new_session=True)
        out: list[str] = []
        err: list[str] = []
        readers = [threading.Thread(target=_lines, args=(stream, callback, chunks), daemon=True)
                   for stream, callback, chunks in ((process.stdout, on_output, out),
                                                    (process.stderr, on_error, err))]
        for reader in readers:
            reader.start()
        try:
            code = process.wait()
        except BaseException:  # Ctrl-C, SIGTERM: let Pulumi finish and unlock, then go on
            self.stop(process)
            raise
        for reader in readers:
            reader.join()
        result = CommandResult(stdout="\n".join(out), stderr="\n".join(err), code=code)
        if code != 0:
            raise create_command_error(result)
        return result

    def stop(self, process: subprocess.Popen) -> None:
        for signum, wait_s in ((signal.SIGINT, self.grace_s), (signal.SIGTERM, 10.0),
                               (signal.SIGKILL, 10.0)):
            try:
                os.killpg(process.pid, signum)
            except ProcessLookupError:
                break
            try:
                process.wait(wait_s)
                break
            except subprocess.TimeoutExpired:
                continue


def _lines(stream: Any, callback: Callable[[str], Any] | None, chunks: list[str]) -> None:
    for line in iter(stream.readline, ""):
        if callback:
            callback(line.rstrip())
        chunks.append(line.rstrip())
    stream.close()


def passphrase(home: Path) -> str:
    """The passphrase that encrypts stack secrets: PULUMI_CONFIG_PASSPHRASE if set, else one
    generated once per SORTIE_HOME (0600), so `sortie reap` from cron can decrypt too.

    The file appears whole or not at all (written and synced under another name, then linked
    into place, which fails if it is there already): two first runs at once end with one
    passphrase, and a run cut short leaves none rather than an empty one. An empty passphrase
    encrypts nothing and is refused."""
    if "PULUMI_CONFIG_PASSPHRASE" in os.environ:
        given = os.environ["PULUMI_CONFIG_PASSPHRASE"]
        if not given.strip():
            raise UsageError("PULUMI_CONFIG_PASSPHRASE is empty: it would encrypt the cluster's "
                             "keys with nothing; set a passphrase or unset it")
        return given
    path = home / "pulumi" / "passphrase"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, temp = tempfile.mkstemp(dir=path.parent, prefix=".passphrase.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as handle:  # mkstemp: 0600
                handle.write(secrets.token_urlsafe(32) + "\n")
                handle.flush()
                os.fsync(handle.fileno())
            with contextlib.suppress(FileExistsError):  # another first run won: use its
                os.link(temp, path)
        finally:
            os.unlink(temp)
    text = path.read_text().strip()
    if not text:
        raise UsageError(f"{path} is empty: it would encrypt the cluster's keys with nothing; "
                         "remove it (a new one is made) or put your passphrase in it")
    return text


def one_line(exc: Exception) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    errors = [line for line in lines if "error:" in line.lower()]
    return (errors or lines or [type(exc).__name__])[-1][:400]


class AutomationStack:
    """A Pulumi stack driven through the Automation API, running `infra.program.main` inline."""

    def __init__(self, stack: Any) -> None:
        self.stack = stack

    def _call(self, what: str, operation: Callable[[], Any]) -> Any:
        from pulumi.automation.errors import CommandError, ConcurrentUpdateError

        try:
            return operation()
        except CommandError as exc:
            message = f"pulumi {what}: {one_line(exc)}"
            if isinstance(exc, ConcurrentUpdateError) or "currently locked" in str(exc):
                holder = LOCK_HOLDER.search(str(exc))
                raise StackLockedError(message, holder["host"] if holder else None,
                                       int(holder["pid"]) if holder else None) from None
            raise StackError(message) from None

    def up(self, config: dict[str, Any], replace: list[str] | None = None) -> dict[str, Any]:
        from pulumi import automation as auto

        self.stack.set_all_config({
            key: auto.ConfigValue(value if isinstance(value, str) else json.dumps(value))
            for key, value in config.items()})
        result = self._call("up", lambda: self.stack.up(replace=replace or None,
                                                         on_output=lambda _line: None))
        return {key: output.value for key, output in result.outputs.items()}

    def config(self) -> dict[str, Any]:
        # Values as `up` set them: strings, lists and numbers as JSON (parse_spec reads both).
        config = self._call("config", self.stack.get_all_config)
        return {key: value.value for key, value in config.items()}

    def outputs(self) -> dict[str, Any]:
        outputs = self._call("stack output", self.stack.outputs)
        return {key: output.value for key, output in outputs.items()}

    def refresh(self, clear_pending_creates: bool = False) -> None:
        self._call("refresh", lambda: self.stack.refresh(
            clear_pending_creates=clear_pending_creates or None, on_output=lambda _line: None))

    def cancel(self) -> None:
        self._call("cancel", self.stack.cancel)

    def resources(self) -> list[StackResource]:
        deployment = self._call("stack export", self.stack.export_stack).deployment or {}
        return [StackResource(r["urn"], r["type"], tuple(r.get("dependencies") or ()),
                              r.get("parent") or "")
                for r in deployment.get("resources", [])]

    def destroy(self, targets: list[str] | None = None) -> None:
        self._call("destroy", lambda: self.stack.destroy(target=targets,
                                                          on_output=lambda _line: None))

    def remove(self) -> None:
        self._call("stack rm", lambda: self.stack.workspace.remove_stack(self.stack.name))


class AutomationStacks:
    """Stacks of the `sortie` project in a state backend: a local file backend by default
    (`$SORTIE_HOME/pulumi/state`, no Pulumi Cloud account needed) or a bucket URL."""

    def __init__(self, home: Path, backend_url: str | None = None) -> None:
        self.home = home
        state = home / "pulumi" / "state"
        self.backend_url = backend_url
        self.url = backend_url or f"file://{state}"
        if backend_url is None:
            state.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.records = RecordStore(self.url)
        self._command: InterruptiblePulumi | None = None

    def _options(self) -> Any:
        from pulumi import automation as auto

        work_dir = self.home / "pulumi" / "work"
        work_dir.mkdir(parents=True, exist_ok=True)
        self._command = self._command or InterruptiblePulumi()
        return auto.LocalWorkspaceOptions(
            work_dir=str(work_dir), secrets_provider="passphrase",
            pulumi_command=self._command,
            env_vars={"PULUMI_CONFIG_PASSPHRASE": passphrase(self.home)},
            project_settings=auto.ProjectSettings(
                name="sortie", runtime="python", backend=auto.ProjectBackend(url=self.url)))

    def open(self, name: str) -> AutomationStack:
        from pulumi import automation as auto

        from sortie.infra.program import main

        return AutomationStack(auto.create_or_select_stack(
            stack_name=name, project_name="sortie", program=main, opts=self._options()))

    def names(self) -> list[str]:
        from pulumi import automation as auto

        workspace = auto.LocalWorkspace(**vars(self._options()))
        return [summary.name for summary in workspace.list_stacks()]


def missing_for(cloud: str) -> list[str]:
    """What driving a stack on ``cloud`` lacks here: the Pulumi CLI, credentials."""
    from sortie.infra.cloud_home import home as cloud_home

    missing = []
    if shutil.which("pulumi") is None:
        missing.append(f"the Pulumi CLI is not on PATH (install it: {PULUMI_INSTALL})")
    if not cloud_home(cloud).has_credentials():
        missing.append(cloud_home(cloud).credentials_hint)
    return missing


def require_cloud_tools(cloud: str, what: str) -> None:
    """One line naming everything missing to drive ``cloud`` here, before anything is created."""
    missing = missing_for(cloud)
    if missing:
        raise UsageError(f"cannot {what}: {' and '.join(missing)}; nothing was created")


def require_cloud_ready(spec: ClusterSpec, what: str) -> None:
    """What the cloud account lacks for the program, in one line, before anything is created.
    A check that cannot ask the cloud is passed over: the launch then says what is wrong."""
    from sortie.infra.cloud_home import home as cloud_home

    try:
        problems = cloud_home(spec.cloud).preflight(spec)
    except Exception:
        return
    if problems:
        raise UsageError(f"cannot {what}: {'; '.join(problems)}; nothing was created")


def backend_stacks(home: Path, backend_url: str | None) -> AutomationStacks | None:
    """The state backend to list: --backend-url, else this controller's file backend when it
    has one. None when there is none to look in."""
    if backend_url is None and not (home / "pulumi" / "state").is_dir():
        return None
    if shutil.which("pulumi") is None:
        if backend_url is None:
            return None  # no CLI: this controller never created a stack there
        raise UsageError(f"--backend-url: listing stacks needs the Pulumi CLI, which is not on "
                         f"PATH (install it: {PULUMI_INSTALL})")
    return AutomationStacks(home, backend_url)


def user_stack(stack: str, cwd: Path) -> AutomationStack:
    """The user's own stack STACK of the Pulumi project in ``cwd`` (its Pulumi.yaml), with the
    user's login, state backend and passphrase: a stack sortie attaches, not one it made."""
    from pulumi import automation as auto
    from pulumi.automation.errors import CommandError

    if shutil.which("pulumi") is None:
        raise UsageError(f"--pulumi-stack: needs the Pulumi CLI, which is not on PATH (install "
                         f"it: {PULUMI_INSTALL}); or save `pulumi stack output --json "
                         "--show-secrets` to a file and pass --outputs FILE")
    if not (cwd / "Pulumi.yaml").is_file():
        raise UsageError(f"--cwd {cwd}: no Pulumi.yaml there (the project of the stack)")
    try:
        return AutomationStack(auto.select_stack(stack_name=stack, work_dir=str(cwd),
                                                 opts=auto.LocalWorkspaceOptions(
                                                     pulumi_command=InterruptiblePulumi())))
    except CommandError as exc:
        raise UsageError(f"--pulumi-stack {stack}: {one_line(exc)}") from None
