"""The `trainsentry` command. Parses arguments and wires modules; holds no logic of its own.

Every subcommand exits non-zero with a one-line reason on bad input (a
contract in DESIGN.md): errors are raised as UsageError and printed once.
"""

from __future__ import annotations

import argparse
import csv
import gc
import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from trainsentry import __version__
from trainsentry.point import Point

if TYPE_CHECKING:
    from trainsentry.rules.model import RuleSet


class UsageError(Exception):
    """A problem the user can fix; printed as one line, exit status 2."""


def default_state_dir() -> Path:
    env = os.environ.get("TRAINSENTRY_STATE_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_STATE_HOME") or os.path.join(Path.home(), ".local", "state")
    return Path(xdg) / "trainsentry"


def _existing(paths: Sequence[str]) -> list[Path]:
    missing = [p for p in paths if not os.path.exists(p)]
    if missing:
        raise UsageError(f"no such file or directory: {missing[0]}")
    return [Path(p) for p in paths]


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text}")
    return value


def cmd_dump(args: argparse.Namespace) -> int:
    from trainsentry.reading import iter_batches

    paths = _existing(args.paths)
    out = sys.stdout
    errors = 0

    def on_error(msg: str) -> None:
        nonlocal errors
        errors += 1
        print(f"trainsentry: skipped {msg}", file=sys.stderr)

    if args.format == "csv":
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(["run", "tag", "step", "wall_time", "value"])
        for batch in iter_batches(paths, on_error):
            writer.writerows(batch)
    else:
        dumps = json.dumps
        for batch in iter_batches(paths, on_error):
            out.write("".join(dumps(p.as_dict()) + "\n" for p in batch))
    out.flush()
    if errors:
        print(f"trainsentry: {errors} corrupt record(s) skipped", file=sys.stderr)
    return 0


def _load_rules(paths: list[str] | None) -> RuleSet:
    from trainsentry.rules.loader import RuleFileError, load_rules

    try:
        return load_rules(paths)
    except RuleFileError as exc:
        for err in exc.errors:
            print(err, file=sys.stderr)
        raise UsageError(f"{len(exc.errors)} error(s) in rule files; nothing was run") from None


def cmd_check(args: argparse.Namespace) -> int:
    from trainsentry.rules.check import check_paths

    _existing(args.paths)
    errors = check_paths(args.paths)
    for err in errors:
        print(err)
    if errors:
        print(f"trainsentry: {len(errors)} error(s)", file=sys.stderr)
        return 1
    print(f"trainsentry: {', '.join(args.paths)}: ok")
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    from trainsentry.reading import iter_points
    from trainsentry.replay import replay

    paths = _existing(args.paths)
    rules = _load_rules(args.rules)

    def on_error(msg: str) -> None:
        print(f"trainsentry: skipped {msg}", file=sys.stderr)

    replay(iter_points(paths, on_error), rules, out=sys.stdout, fmt=args.format)
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from trainsentry.rules.engine import Engine
    from trainsentry.runtime import Daemon
    from trainsentry.shutdown import on_stop, signals_deferred
    from trainsentry.sinks.terminal import AlertPrinter
    from trainsentry.state import StateDB
    from trainsentry.store import Store

    paths = _existing(args.paths or ["."])
    engine = Engine(_load_rules(args.rules))
    state_dir = Path(args.state_dir) if args.state_dir else default_state_dir()
    try:
        state = StateDB(state_dir / "state.db")
    except Exception as exc:
        raise UsageError(f"cannot open state dir {state_dir}: {exc}") from None
    store = Store()
    alerts_jsonl = Path(args.alerts_jsonl) if args.alerts_jsonl else None
    printer = AlertPrinter(since=time.time() - args.history, jsonl_path=alerts_jsonl)

    def evaluate(points: list[Point]) -> None:
        store.extend(points)
        printer(engine.feed_all(points))

    def print_points(points: list[Point]) -> None:
        text = "".join(json.dumps(p.as_dict()) + "\n" for p in points)
        with signals_deferred():
            sys.stdout.write(text)
            sys.stdout.flush()

    def released(run: str) -> None:
        store.release_run(run)
        printer(engine.finish(run, "run deleted"))

    sinks = [evaluate, print_points] if args.verbose >= 2 else [evaluate]
    daemon = Daemon(
        paths,
        state,
        sinks,
        poll=args.poll,
        on_release=released,
        on_cycle=lambda: printer(engine.tick(time.time())),
    )
    on_stop(daemon.stop)
    where = ", ".join(str(p) for p in paths)
    print(
        f"trainsentry {__version__}: watching {where} with {len(engine.rules)} rules "
        f"(state in {state_dir})",
        flush=True,
    )
    try:
        daemon.run_forever()
    finally:
        printer.close()
    hidden = f", {printer.hidden} historical transition(s) not shown" if printer.hidden else ""
    print(
        f"trainsentry: stopped after reading {daemon.stats.points} points "
        f"from {daemon.stats.files} files{hidden}",
        flush=True,
    )
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trainsentry",
        description="Watches the logs of training jobs and alerts before a run is lost.",
    )
    parser.add_argument("--version", action="version", version=f"trainsentry {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="watch log directories and evaluate rules live")
    run.add_argument("paths", nargs="*", metavar="PATH", help="log roots to watch (default .)")
    run.add_argument("--state-dir", help="where offsets and alert state live")
    run.add_argument(
        "--rules",
        action="append",
        metavar="PATH",
        help="rule file or directory (repeatable; default: the shipped pack; 'default' names it)",
    )
    run.add_argument("--alerts-jsonl", metavar="FILE", help="append alert transitions here")
    run.add_argument(
        "--history",
        type=_positive_float,
        default=3600.0,
        metavar="SECONDS",
        help="show alerts from data older than this at startup (default 3600)",
    )
    run.add_argument(
        "--poll",
        type=_positive_float,
        metavar="SECONDS",
        help="poll every SECONDS instead of inotify (network filesystems are polled anyway)",
    )
    run.add_argument(
        "-v", "--verbose", action="count", default=0, help="-v: log reads; -vv: print points"
    )
    run.set_defaults(func=cmd_run)

    dump = sub.add_parser("dump", help="print the points as parsed")
    dump.add_argument("paths", nargs="+", metavar="PATH")
    dump.add_argument("--format", choices=["jsonl", "csv"], default="jsonl")
    dump.set_defaults(func=cmd_dump)

    replay = sub.add_parser("replay", help="evaluate rules over finished runs (a backtest)")
    replay.add_argument("paths", nargs="+", metavar="PATH")
    replay.add_argument("--rules", action="append", metavar="PATH", help="as for run")
    replay.add_argument("--format", choices=["text", "jsonl"], default="text")
    replay.set_defaults(func=cmd_replay)

    check = sub.add_parser("check", help="lint rule files: every error as file:line:col")
    check.add_argument("paths", nargs="+", metavar="PATH")
    check.set_defaults(func=cmd_check)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    # Backfills allocate millions of small tuples that live until evaluated;
    # the default gen-0 threshold (700) collects over and over for nothing
    # (measured: 15-20% of a 1M-point read). Reference cycles are rare here.
    gc.set_threshold(100_000, 50, 100)
    parser = build_parser()
    args = parser.parse_args(argv)
    level = logging.WARNING
    if getattr(args, "verbose", 0) >= 1:
        level = logging.INFO
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("watchdog").setLevel(logging.WARNING)
    try:
        return int(args.func(args))
    except UsageError as exc:
        print(f"trainsentry: {exc}", file=sys.stderr)
        return 2
    except FileNotFoundError as exc:
        print(f"trainsentry: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
