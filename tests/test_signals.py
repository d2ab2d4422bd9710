"""Signals held while a step must not be cut short (launching torchrun, teardown), in-process."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from sortie.core.progress import shielded

pytestmark = pytest.mark.unit


class Stopped(Exception):
    pass


@pytest.fixture
def notes() -> list[str]:
    return []


@pytest.fixture
def restore_handlers() -> Iterator[None]:
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)


def send(signum: int) -> None:
    os.kill(os.getpid(), signum)
    time.sleep(0.05)  # Python runs the handler between bytecodes of the main thread


def test_ctrl_c_waits_for_the_step_then_interrupts(notes: list[str], restore_handlers: None):
    done = []
    with (pytest.raises(KeyboardInterrupt),
          shielded(SimpleNamespace(note=notes.append), "finishing first")):
        send(signal.SIGINT)
        send(signal.SIGINT)  # a second Ctrl-C does not cut it short either
        done.append("step")
    assert done == ["step"]
    assert notes == ["finishing first", "finishing first"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_sigterm_is_handed_to_the_handler_it_was_for(notes: list[str], restore_handlers: None):
    def on_sigterm(_signum: int, _frame: object) -> None:
        raise Stopped

    signal.signal(signal.SIGTERM, on_sigterm)
    with pytest.raises(Stopped), shielded(SimpleNamespace(note=notes.append), "finishing first"):
        send(signal.SIGTERM)
    assert notes == ["finishing first"]
    assert signal.getsignal(signal.SIGTERM) is on_sigterm


def test_an_ignored_ctrl_c_stays_ignored(notes: list[str], restore_handlers: None):
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # how a shell starts a background job
    with shielded(SimpleNamespace(note=notes.append), "finishing first"):
        send(signal.SIGINT)
    assert notes == []



def test_sigint_works_when_sortie_was_started_with_it_ignored(
        restore_handlers: None, tmp_path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]):
    """Issue 47: started with `&` from a script, sortie got SIGINT ignored, installed no
    handler, and `kill -INT` did nothing. It installs its own at start."""
    from sortie.cli import app

    monkeypatch.setenv("SORTIE_HOME", str(tmp_path / "home"))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    assert app.main(["status"]) == 0
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
