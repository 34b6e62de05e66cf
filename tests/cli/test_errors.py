"""CLI arguments and broker URLs that are wrong: one line on stderr, exit code 2, no traceback and
no password; and tracebacks free of the missing-uvloop ImportError."""

from __future__ import annotations

import argparse
import sys
import traceback

import pytest

from debatebus._worker import DebateBus
from debatebus.cli import _run, build_parser, main
from debatebus.cli._bus_cmds import _observe
from debatebus.exceptions import ConfigError

SECRET = "hunter2secret"


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse's usage errors
        code = int(exc.code or 0)
    out = capsys.readouterr()
    return code, out.out + out.err


@pytest.mark.parametrize(("argv", "says"), [
    (["tail", "t", "--broker", f"redis://:{SECRET}@localhost:abc/0"], "bad broker URL"),
    (["tail", "t", "--broker", f"redis://:{SECRET}@localhost:99999/0"], "Port out of range"),
    (["publish", "t", "--input", "x", "--broker", f"redis://:{SECRET}@[::1/0"], "Invalid IPv6"),
    (["publish", "t", "--input", "x", "--broker", f"redis+pub://:{SECRET}@h:1/0"],
     "unsupported broker URL 'redis+pub://:***@h:1/0'"),
    (["publish", "t", "--input", "x", "--broker", f"kafka://u:{SECRET}@b1:9092,b2:x"],
     "bad broker URL"),
    (["web", "--broker", f"redis://:{SECRET}@localhost:abc/0"], "bad broker URL"),
    (["tail", "t", "--count", "0"], "--count: must be a whole number ≥ 1, not '0'"),
    (["tail", "t", "--count", "many"], "--count: must be a whole number ≥ 1"),
    (["worker", "m:app", "--metrics-port", "99999"], "must be a port number from 1 to 65535"),
    (["worker", "m:app", "--metrics-port", "x"], "--metrics-port: must be a port number"),
    (["worker", "m:app", "--concurrency", "-3"], "--concurrency: must be a whole number ≥ 1"),
    (["web", "--port", "0"], "--port: must be a port number"),
    (["web", "--history", "1.5"], "--history: must be a whole number ≥ 1"),
    (["check", "--timeout", "nan"], "--timeout: must be a number of seconds > 0, not 'nan'"),
    (["check", "--max-age", "-1"], "--max-age: must be a number of seconds > 0"),
    (["publish", "t", "--input", "x", "--wait", "--timeout", "inf"], "--timeout: must be"),
    (["run", "topic", "--rounds", "0"], "--rounds: must be a whole number ≥ 1"),
    (["publish", "t", "--payload", "{input: x}", "--broker", "memory://"],
     "--payload must be a JSON object: Expecting property name enclosed in double quotes "
     "(line 1, column 2: 'input: x}')"),
    (["publish", "t", "--payload", f'{{"input": "x", "password": "{SECRET}"', "--broker",
      "memory://"], "--payload must be a JSON object: Expecting ',' delimiter (line 1, column"),
])
def test_bad_arguments_get_one_line_and_exit_2(
        capsys: pytest.CaptureFixture[str], argv: list[str], says: str) -> None:
    code, printed = run_cli(capsys, *argv)
    assert code == 2
    assert says in printed
    assert len(printed.strip().splitlines()) == 1, printed
    assert "Traceback" not in printed
    assert SECRET not in printed


def test_check_redacts_the_url_it_prints(capsys: pytest.CaptureFixture[str]) -> None:
    code, printed = run_cli(capsys, "check", "--broker", f"redis+pub://:{SECRET}@h:1/0")
    assert code == 1  # check answers "unhealthy" for whatever stops it, with the reason
    assert "unhealthy" in printed
    assert SECRET not in printed


def test_metrics_host_needs_metrics_port() -> None:
    args = build_parser().parse_args(["worker", "m:app", "--metrics-host", "0.0.0.0"])
    with pytest.raises(ConfigError, match="--metrics-host needs --metrics-port"):
        _observe(DebateBus("memory://"), args)


def test_a_missing_uvloop_is_not_the_context_of_later_errors(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop now raises ImportError

    async def boom(args: argparse.Namespace) -> int:
        raise RuntimeError("the command failed")

    with pytest.raises(RuntimeError) as info:
        _run(boom, argparse.Namespace())
    assert info.value.__context__ is None
    assert "No module named 'uvloop'" not in "".join(traceback.format_exception(info.value))
