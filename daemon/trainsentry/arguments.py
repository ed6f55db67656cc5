"""The command line's grammar: every subcommand and its flags, and nothing they do.

Kept apart from cli.py (the handlers) so each stays readable; `build_parser`
names the subcommand in `args.command` and cli.py dispatches on it.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any, NoReturn

from trainsentry import __version__


class Parser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line (what is wrong, where to look), not the usage block."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def _config_flag(key: str) -> Callable[[str], Any]:
    """The config file's parser for `key` as an argparse type: `--history 1h` as `history: 1h`.

    One parser for the file, the TRAINSENTRY_* variables and the flags, so they
    take the same words. It is imported only when the flag is given (pydantic
    costs a quarter second that `replay` and `dump` need not pay).
    """

    def convert(text: str) -> Any:
        from trainsentry.config.schema import FLAG_PARSERS

        try:
            return FLAG_PARSERS[key](text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return convert


def _route_arguments(group: argparse._ActionsContainer, positional: bool = False) -> None:
    if not positional:
        group.add_argument(
            "--notify",
            action="append",
            metavar="[SEVERITY:]URL",
            help="apprise URL (repeatable); 'critical:URL' for criticals only; "
            "env:NAME or @FILE read it from there",
        )
    group.add_argument(
        "--alertmanager",
        action="append",
        metavar="URL",
        help="push to this Alertmanager's /api/v2/alerts (repeatable: every instance)",
    )
    group.add_argument(
        "--link-template",
        metavar="TEMPLATE",
        help="link in messages, e.g. 'http://tb:6006/#scalars&regexInput={run}' "
        "({run} {rule} {metric} {step})",
    )
    group.add_argument(
        "--notify-timeout",
        type=_config_flag("notify_timeout"),
        default=argparse.SUPPRESS,
        metavar="DURATION",
        help="connect/read timeout of each send (default 10s)",
    )


def _color_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--color",
        choices=["auto", "always", "never"],
        default="auto",
        help="auto: tables and colour on a terminal, plain lines elsewhere (NO_COLOR: no "
        "colour); never: plain lines on a terminal too; always: also when piped",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="trainsentry",
        description="Watches the logs of training jobs and alerts before a run is lost.",
    )
    parser.add_argument("--version", action="version", version=f"trainsentry {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="watch log directories and evaluate rules live")
    run.add_argument("paths", nargs="*", metavar="PATH", help="log roots to watch (default .)")
    run.add_argument("--config", metavar="FILE", help="the daemon's YAML config file")
    run.add_argument("--state-dir", help="where offsets and alert state live")
    run.add_argument(
        "--http",
        metavar="HOST:PORT",
        help="serve /metrics, /healthz, /api/* here (default 127.0.0.1:9465; 'off')",
    )
    run.add_argument("--shard", metavar="I/N", help="watch only the runs of shard I of N (1-based)")
    run.add_argument(
        "--rules",
        action="extend",
        nargs="+",
        metavar="PATH",
        help="rule files or directories, later ones overriding earlier rules of the same name "
        "(default: the shipped pack; 'default' names it)",
    )
    run.add_argument("--alerts-jsonl", metavar="FILE", help="append alert transitions here")
    run.add_argument(
        "--history",
        type=_config_flag("history"),
        default=argparse.SUPPRESS,
        metavar="DURATION",
        help="at startup, show alerts from data at most this old (default 1h; 'all')",
    )
    run.add_argument(
        "--poll",
        type=_config_flag("poll"),
        default=argparse.SUPPRESS,
        metavar="DURATION",
        help="poll this often instead of inotify, e.g. 5s (network filesystems are polled "
        "anyway; 'off': inotify)",
    )
    run.add_argument(
        "-v", "--verbose", action="count", default=0, help="-v: log reads; -vv: print points"
    )
    notify = run.add_argument_group("notifications")
    _route_arguments(notify)
    notify.add_argument(
        "--group-wait",
        type=_config_flag("group_wait"),
        default=argparse.SUPPRESS,
        metavar="DURATION",
        help="warnings wait this long to be batched per run (default 30s; criticals go at once)",
    )
    notify.add_argument(
        "--group-interval",
        type=_config_flag("group_interval"),
        default=argparse.SUPPRESS,
        metavar="DURATION",
        help="a run's alerts after its first page join it and leave together at most this "
        "often (default 5m; 0: each at once)",
    )
    notify.add_argument(
        "--repeat-interval",
        type=_config_flag("repeat_interval"),
        default=argparse.SUPPRESS,
        metavar="DURATION",
        help="repeat a still-firing alert after this long (default 4h; 0: never)",
    )
    notify.add_argument(
        "--rate-limit",
        type=_config_flag("rate_limit"),
        default=argparse.SUPPRESS,
        metavar="COUNT/DURATION",
        help="at most COUNT messages per DURATION per receiver (default 10/10m; 'off')",
    )
    notify.add_argument(
        "--control-dir",
        metavar="DIR",
        help="write stop files under DIR/<run>/.trainsentry/ instead of the run directories",
    )
    _color_argument(run)

    status = sub.add_parser("status", help="the running daemon's runs and firing alerts")
    status.add_argument(
        "--address", default="127.0.0.1:9465", metavar="HOST:PORT", help="its --http address"
    )
    _color_argument(status)

    test = sub.add_parser("notify-test", help="send a sample alert through routes, report each")
    test.add_argument("urls", nargs="*", metavar="URL", help="[warning:|critical:]apprise URL")
    _route_arguments(test, positional=True)

    dump = sub.add_parser("dump", help="print the points as parsed")
    dump.add_argument("paths", nargs="+", metavar="PATH")
    dump.add_argument("--format", choices=["jsonl", "csv"], default="jsonl")

    replay = sub.add_parser("replay", help="evaluate rules over finished runs (a backtest)")
    replay.add_argument("paths", nargs="+", metavar="PATH")
    replay.add_argument("--rules", action="extend", nargs="+", metavar="PATH", help="as for run")
    replay.add_argument("--format", choices=["text", "jsonl"], default="text")
    replay.add_argument(
        "--report", metavar="FILE.html", help="write a self-contained HTML backtest report"
    )
    replay.add_argument(
        "--compare-rules",
        action="extend",
        nargs="+",
        metavar="PATH",
        help="with --report: also replay under this pack (its files, as for --rules) "
        "and compare it with --rules",
    )
    _color_argument(replay)

    check = sub.add_parser("check", help="lint rule files: every error as file:line:col")
    check.add_argument("paths", nargs="+", metavar="PATH")

    test = sub.add_parser("test", help="run rule unit tests (promtool-style, on a step axis)")
    test.add_argument("paths", nargs="+", metavar="FILE", help="test files or directories of them")
    test.add_argument("--junit", metavar="FILE", help="also write a JUnit XML report here")
    test.add_argument("-k", metavar="TEXT", help="only the cases whose name contains TEXT")
    test.add_argument(
        "-v", "--verbose", dest="list_passing", action="store_true", help="list passing cases too"
    )

    demo = sub.add_parser("demo", help="watch a simulated training job diverge (under a minute)")
    demo.add_argument("--fast", action="store_true", help="run in a few seconds (for tests)")
    demo.add_argument(
        "--steps",
        type=int,
        default=1000,
        metavar="N",
        help="healthy training steps before the learning-rate ramp (default 1000)",
    )
    demo.add_argument("--keep", metavar="DIR", help="write the logs under DIR and keep them")
    demo.add_argument(
        "--notify", action="append", metavar="URL", help="show where alerts would be sent"
    )
    _color_argument(demo)
    return parser
