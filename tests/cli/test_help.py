"""``--help`` of every debatebus command shows every default its options have."""

from __future__ import annotations

import argparse
import re

import pytest

from debatebus.cli import build_parser, main


def _commands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    (sub,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def _shown(default: object) -> set[str]:
    """How a default may be written in a help text: as is, or a whole float without ``.0``."""
    forms = {str(default)}
    if isinstance(default, float):
        forms.add(f"{default:g}")
    return forms


@pytest.fixture(autouse=True)
def wide_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    # argparse wraps at the terminal width, and may split a value such as round-robin at its hyphen.
    monkeypatch.setenv("COLUMNS", "1000")


def test_every_command_is_walked() -> None:
    assert {"worker", "publish", "tail", "demo", "run", "replay", "failures", "check",
            "asyncapi", "web"} <= set(_commands())


def _entries(help_text: str) -> dict[str, str]:
    """Each option's entry in a help text, by its first option string (or a positional's name):
    an entry starts at a line indented by two spaces and runs until the next one."""
    entries: dict[str, str] = {}
    name = ""
    for line in help_text.splitlines():
        if re.match(r"^  \S", line):
            name = line.split()[0].rstrip(",")
            entries[name] = line
        elif line.startswith("   ") and name:
            entries[name] += " " + line.strip()
        else:
            name = ""
    return entries


@pytest.mark.parametrize("command", sorted(_commands()))
def test_every_default_is_in_the_help(command: str) -> None:
    parser = _commands()[command]
    entries = _entries(parser.format_help())
    defaults = [a for a in parser._actions
                if a.default is not None and a.default is not False
                and a.default != argparse.SUPPRESS]
    for action in defaults:
        entry = entries[(action.option_strings or [action.dest])[0]]
        assert any(form in entry for form in _shown(action.default)), (
            f"debatebus {command} --help does not show the default {action.default!r}: {entry!r}")


def test_publish_wait_timeout_is_shown(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["publish", "--help"])
    assert exited.value.code == 0
    timeout = _entries(capsys.readouterr().out)["--timeout"]
    assert "with --wait" in timeout and "300" in timeout


def test_a_default_the_help_does_not_state_is_appended_and_flags_are_left_alone() -> None:
    commands = _commands()
    web = commands["web"].format_help()
    assert "port to listen on (default: 8000)" in web
    assert "(default: debate:events)" in web
    run = commands["run"].format_help()
    assert "default: False" not in run and "default: None" not in run
    assert "(default 2)" in run and "(default: 2)" not in run
