"""Issue 66 (6): `sortie images --build` shows its stages (a bar, the stage's latest line, the
time so far) rather than one line for minutes."""

from __future__ import annotations

import io
import re
from types import SimpleNamespace

import pytest
from rich.console import Console

from sortie.core.errors import SortieError
from sortie.stacks.booted import image


@pytest.mark.unit
def test_the_build_shows_each_stage_and_its_latest_line():
    from sortie.cli.stack_commands import _build_with_progress

    heard: list[tuple[int, str]] = []

    def build_image(say, stage):
        for number, line in [(0, "I: Retrieving InRelease"), (0, "I: Installing core packages"),
                             (1, "the fixes a cloud image has"), (2, "tar and zstd")]:
            stage(number, line)
            heard.append((number, line))
        say("image built in 1 s")

    shown = io.StringIO()
    console = Console(file=shown, force_terminal=True, width=160)
    _build_with_progress(SimpleNamespace(BUILD_STAGES=image.BUILD_STAGES,
                                         build_image=build_image), console)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", shown.getvalue())
    assert len(heard) == 4 and "image built in 1 s" in text, text
    assert "I: Installing core packages" in text and "packing the image 2/3" in \
        text.replace("━", "").replace("╺", "").replace("  ", " "), text


@pytest.mark.e2e
def test_a_tool_is_streamed_line_by_line_and_its_failure_named():
    lines: list[str] = []
    image.run_tool(["sh", "-c", "echo 'I: one'; echo 'I: two' >&2"], "a tool", on_line=lines.append)
    assert lines == ["I: one", "I: two"]
    with pytest.raises(SortieError, match=r"^a tool failed \(exit 3\): I: late \| last$"):
        image.run_tool(["sh", "-c", "echo 'I: late'; echo last; exit 3"], "a tool",
                       on_line=lines.append)
    with pytest.raises(SortieError, match="^slow: no end after 0.5 s$"):
        image.run_tool(["sleep", "30"], "slow", timeout_s=0.5, on_line=lines.append)
