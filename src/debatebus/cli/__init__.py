"""``debatebus`` command line: worker, publish, tail, run, demo, fork, eval (and ops commands)."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import sys
from collections.abc import Callable, Coroutine, Sequence
from types import ModuleType
from typing import Any, NoReturn

from debatebus._redaction import redact
from debatebus.cli._ops_cmds import list_failures, parse_since, replay_range
from debatebus.exceptions import DebatebusError

__all__ = [
    "list_failures",
    "main",
    "parse_since",
    "replay_range",
]

# Each module contributes ``add_parser(subparsers)``; its parsers set ``func`` (async, -> exit code).
_COMMAND_MODULES = (
    "debatebus.cli._bus_cmds",
    "debatebus.cli._run_cmd",
    "debatebus.cli._ops_cmds",
    "debatebus.cli._fork_cmd",
    "debatebus.cli._observe_cmds",
    "debatebus.cli._web_cmds",
    "debatebus.cli._eval_cmd",
)


def _load(name: str) -> ModuleType | None:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name == name:  # the module itself is absent in this build, not one of its imports
            return None
        raise


class _Parser(argparse.ArgumentParser):
    """Usage errors in one line on stderr, exit code 2, secrets masked; ``--help`` shows every
    default."""

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        """Append ``(default: X)`` to an option's help when it has a value default its help does
        not already state (a flag's False and an unset None are no defaults worth showing)."""
        text, default = kwargs.get("help"), kwargs.get("default")
        if (isinstance(text, str) and text != argparse.SUPPRESS and "default" not in text
                and default is not None and default is not False
                and default != argparse.SUPPRESS):
            kwargs["help"] = f"{text} (default: %(default)s)"
        return super().add_argument(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {redact(message)} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="debatebus", description="Multi-agent LLM debates served on Redis and Kafka."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                parser_class=_Parser)
    for name in _COMMAND_MODULES:
        module = _load(name)
        if module is None:
            continue
        before = set(sub.choices)
        module.add_parser(sub)
        for command in set(sub.choices) - before:  # modules may expose one ``run`` instead
            if sub.choices[command].get_default("func") is None:
                sub.choices[command].set_defaults(func=module.run)
    return parser


def _runner() -> Callable[[Coroutine[Any, Any, int]], int]:
    """uvloop's ``run`` when installed, else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run
    return uvloop.run


def _run(func: Callable[[argparse.Namespace], Coroutine[Any, Any, int]], args: argparse.Namespace) -> int:
    # The runner is chosen before anything runs, so no exception of the command can carry the
    # ImportError of a missing uvloop as its __context__.
    return int(_runner()(func(args)))


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _run(args.func, args)
    except DebatebusError as exc:
        print(f"debatebus: {redact(str(exc))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
