"""A NAME on the command line is a sortie name, never a path: nothing outside $SORTIE_HOME's own
directories is ever touched, and an unknown name is an error, not "0 resources remain"."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import sortie

pytestmark = pytest.mark.e2e

HOSTILE_NAMES = ["..", ".", "../..", "abc\n", "a/b", "Bad", "a_b", "x" * 64]


def one_line_usage_error(result, field: str = "NAME") -> str:
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"sortie: error: {field}"), result.stderr
    assert "Traceback" not in result.stderr
    return lines[0]


@pytest.fixture
def precious(sortie_home: Path, tmp_path: Path) -> list[Path]:
    """What a careless NAME could destroy: a directory outside sortie's, and sortie's own state."""
    victim = tmp_path / "victim"
    victim.mkdir()
    passphrase = sortie_home / "pulumi" / "passphrase"
    passphrase.parent.mkdir(parents=True)
    for path in (victim / "results.txt", passphrase):
        path.write_text("keep me")
    return [victim / "results.txt", passphrase]


def test_down_refuses_a_path_and_deletes_nothing(precious: list[Path], tmp_path: Path):
    """Before: `sortie down /tmp/victim` deleted it and said "0 resources remain"; `down ..`
    deleted all of $SORTIE_HOME."""
    victim = precious[0].parent
    for name in [str(victim), *HOSTILE_NAMES]:
        one_line_usage_error(sortie("down", name, cwd=tmp_path))
    assert all(path.read_text() == "keep me" for path in precious)


def test_down_refuses_a_symlink_planted_among_the_clusters(precious: list[Path],
                                                           sortie_home: Path, tmp_path: Path):
    clusters = sortie_home / "clusters"
    clusters.mkdir()
    (clusters / "evil").symlink_to(precious[0].parent)
    line = one_line_usage_error(sortie("down", "evil", cwd=tmp_path))
    assert line == "sortie: error: NAME: no sortie named 'evil' (see `sortie status`)"
    everything = sortie("down", "--all", cwd=tmp_path)
    assert everything.returncode == 0 and everything.stdout.strip() == "no sorties"
    assert all(path.read_text() == "keep me" for path in precious)
    assert (clusters / "evil").is_symlink()


def test_an_unknown_name_is_an_error_not_a_clean_teardown(sortie_home: Path, tmp_path: Path):
    result = sortie("down", "nope", cwd=tmp_path)
    line = one_line_usage_error(result)
    assert line == "sortie: error: NAME: no sortie named 'nope' (see `sortie status`)"
    assert "0 resources remain" not in result.stdout


@pytest.mark.parametrize("command", [["ssh", "{name}", "node-0"], ["logs", "{name}"]])
def test_ssh_and_logs_refuse_names_that_are_paths(command: list[str], precious: list[Path],
                                                  tmp_path: Path):
    outside = tmp_path / "logs"  # what `logs ..` would read: runs/../logs/*.log
    outside.mkdir()
    (outside / "node-0.log").write_text("not a sortie's log")
    (tmp_path / "runs").mkdir()
    for name in HOSTILE_NAMES:
        one_line_usage_error(sortie(*[word.format(name=name) for word in command], cwd=tmp_path))


def test_name_flag_is_matched_in_full(sortie_home: Path, tmp_path: Path):
    """Before: `re.match` with `$` accepted a trailing newline."""
    for name in ("abc\n", "Abc", "a" * 64):
        one_line_usage_error(sortie("up", "--name", name, cwd=tmp_path), "--name")
    assert not (sortie_home / "clusters").exists()
