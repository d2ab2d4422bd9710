"""The ``sortie`` command line: the group, its commands (one module per family: running jobs,
the fleet, stack profiles, looking inside a sortie) and the entry point, which turns every error
into one line and an exit code. Commands only parse flags and render; the work is done below,
in the run engine (`sortie/engine/`), the fleet (`sortie/fleet/`) and the run directory
(`sortie/rundir/`).

Exit codes: 0 success, 1 a failure (training or teardown), 2 bad input (nothing was started),
130 interrupted by Ctrl-C, 141 its output's reader went away (`| head`), 143 stopped by SIGTERM.
Errors are one line on stderr.
"""

from __future__ import annotations

import gc
import importlib
import logging
import os
import signal
import sys
import threading

import click

from sortie.core.errors import Interrupted, SortieError, Terminated, interruption
from sortie.core.naming import PROFILES_ENV

# Each command by name: (its module in sortie/cli/, its function). A command's module is imported
# only when that command runs (or help lists them all): `sortie exec` pays for its own imports,
# not for every command's.
COMMANDS = {
    "run": ("run_commands", "run"), "exec": ("run_commands", "exec_"),
    "up": ("run_commands", "up"), "watch": ("run_commands", "watch"),
    "attach": ("fleet_commands", "attach"), "status": ("fleet_commands", "status"),
    "costs": ("fleet_commands", "costs_"), "budget": ("fleet_commands", "budget"),
    "down": ("fleet_commands", "down"), "reap": ("fleet_commands", "reap"),
    "plan": ("stack_commands", "plan"), "profiles": ("stack_commands", "profiles"),
    "init": ("stack_commands", "init"), "images": ("stack_commands", "images"),
    "rehearse": ("stack_commands", "rehearse"),
    "ssh": ("node_commands", "ssh"), "ssh-config": ("node_commands", "ssh_config"),
    "check": ("node_commands", "check"), "logs": ("node_commands", "logs"),
    "report": ("node_commands", "report"), "hosts": ("node_commands", "hosts"),
    "runs": ("node_commands", "runs"),
    "jobs": ("job_commands", "jobs"), "cancel": ("job_commands", "cancel"),
    "repair": ("job_commands", "repair"), "slurm-lab": ("lab_commands", "slurm_lab"),
}


class LazyGroup(click.Group):
    """The command group, loading a command's module when it is asked for."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        module, function = COMMANDS[cmd_name]
        command = getattr(importlib.import_module(f"sortie.cli.{module}"), function)
        if not gc.isenabled():  # turned off while modules load (`sortie.cli.start`)
            gc.freeze()
            gc.enable()
        return command


def _use_profiles(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    """--profiles DIR: the user's profile directories, looked in before the shipped ones."""
    if value:
        os.environ[PROFILES_ENV] = value


@click.group(cls=LazyGroup,
             context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="sortie", prog_name="sortie")
@click.option("--profiles", metavar="DIR[:DIR...]", expose_value=False, is_eager=True,
              callback=_use_profiles,
              help=f"Directories of your own stack profiles (Pulumi.<name>.yaml), looked in "
                   f"before the shipped ones. Default: ${PROFILES_ENV}.")
def app() -> None:
    """Short-lived multi-node GPU clusters: provision, bootstrap, train, collect, tear down.

    One experiment = one sortie. `sortie run` does it all and always tears down; `up`, `status`,
    `ssh` and `down` let you hold a cluster and look inside it. `profiles` lists the cloud
    profiles, `plan` shows one's resources and cost, `init` makes a Pulumi project of one.
    """


def _on_sigterm(_signum: int, _frame: object) -> None:
    raise Terminated


def main(argv: list[str] | None = None) -> int:
    """Entry point: runs the CLI and turns every error into one line and an exit code."""
    signal.signal(signal.SIGTERM, _on_sigterm)
    # A shell starts a script's `sortie ... &` with SIGINT ignored, and a child keeps that: a
    # `kill -INT` (or Ctrl-C after `fg`) would then do nothing. sortie's teardown is its own.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    # paramiko's transport threads log broken connections (with tracebacks) when teardown stops
    # a node mid-stream; sortie reports connection failures itself. SORTIE_DEBUG=1 shows them.
    if not os.environ.get("SORTIE_DEBUG"):
        logging.getLogger("paramiko").addHandler(logging.NullHandler())
        logging.getLogger("paramiko").propagate = False
    args = sys.argv[1:] if argv is None else argv
    try:
        # make_context/invoke rather than app.main(): main() turns KeyboardInterrupt (and so
        # SIGTERM) into a bare Abort and prints a blank line.
        with app.make_context("sortie", list(args)) as ctx:
            ctx.meta["argv"] = list(args)  # as given (`exec --detach` starts them again)
            app.invoke(ctx)
        return 0
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.UsageError as exc:
        _fail(exc.format_message())
        return 2
    except click.ClickException as exc:
        _fail(exc.format_message())
        return exc.exit_code
    except KeyboardInterrupt as exc:
        signaled = interruption(exc) == "SIGTERM"
        _fail(str(exc) if isinstance(exc, Interrupted) else
              "stopped by SIGTERM" if signaled else "interrupted")
        return 143 if signaled else 130
    except SortieError as exc:
        _fail(str(exc))
        return exc.exit_code
    except BrokenPipeError:  # `sortie logs RUN | head`: the reader is gone, nothing to say
        return _reader_gone()


def _reader_gone() -> int:
    """Exit as a shell's command whose reader left (141, SIGPIPE), quietly: what is still
    buffered for stdout goes nowhere rather than into a second BrokenPipeError at exit."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 141


def _fail(message: str) -> None:
    print(f"sortie: error: {' '.join(message.split())}", file=sys.stderr)


def entry() -> None:
    """The console script ``sortie``."""
    code = main()
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        code = _reader_gone()
    if any(thread.is_alive() and not thread.daemon for thread in threading.enumerate()
           if thread is not threading.main_thread()):
        # A Ctrl-C does not wait for node workers (e.g. one still retrying SSH to a node that
        # teardown has since removed) and Python would join them, up to their timeouts, before
        # exiting. Teardown is done and reported by now: leave without them.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    gc.freeze()  # what is left is freed with the process: no last collection over it
    sys.exit(code)


if __name__ == "__main__":
    entry()
