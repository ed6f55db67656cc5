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
    from trainsentry.alerts.route import Route
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


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if value < 0 or value != value:
        raise argparse.ArgumentTypeError(f"expected seconds >= 0, got {text}")
    return value


def _rate(text: str) -> tuple[int, float] | None:
    if text in ("0", "none", "off"):
        return None
    count, _, period = text.partition("/")
    try:
        n, seconds = int(count), float(period)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected COUNT/SECONDS like 10/600, got {text!r}"
        ) from None
    if n < 1 or seconds <= 0:
        raise argparse.ArgumentTypeError(f"expected COUNT >= 1 and SECONDS > 0, got {text!r}")
    return n, seconds


def _routes(args: argparse.Namespace) -> list[Route]:
    """--notify and --alertmanager as routes; a bad one is a usage error naming it (masked)."""
    from trainsentry.alerts.route import RouteError, parse_alertmanager, parse_notify

    timing = {
        "group_wait": getattr(args, "group_wait", 30.0),
        "repeat_interval": getattr(args, "repeat_interval", 4 * 3600.0),
        "rate_limit": getattr(args, "rate_limit", (10, 600.0)),
        "timeout": args.notify_timeout,
    }
    try:
        routes = [parse_notify(u, **timing) for u in (args.notify or [])]
        routes += [parse_alertmanager(u, args.notify_timeout) for u in (args.alertmanager or [])]
    except RouteError as exc:
        raise UsageError(str(exc)) from None
    seen: set[str] = set()
    for route in routes:
        if route.receiver in seen:
            raise UsageError("the same notification URL is given twice")
        seen.add(route.receiver)
    return routes


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


def cmd_test(args: argparse.Namespace) -> int:
    from trainsentry.ruletest.command import run_tests

    _existing(args.paths)
    junit = Path(args.junit) if args.junit else None
    return run_tests(
        args.paths, out=sys.stdout, junit=junit, select=args.k, verbose=args.list_passing
    )


def cmd_demo(args: argparse.Namespace) -> int:
    from trainsentry.demo import run_demo

    keep = Path(args.keep) if args.keep else None
    if keep is not None and keep.exists() and any(keep.iterdir()):
        raise UsageError(f"--keep {keep}: the directory is not empty; give a new or empty one")
    return run_demo(
        out=sys.stdout, fast=args.fast, healthy_steps=args.steps, keep=keep, notify=args.notify
    )


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
    from trainsentry.alerts.notifier import Notifier
    from trainsentry.alerts.outbox import Outbox
    from trainsentry.rules.engine import Engine
    from trainsentry.rules.lifecycle import Transition
    from trainsentry.runtime import Daemon
    from trainsentry.shutdown import on_stop, signals_deferred
    from trainsentry.sinks.terminal import AlertPrinter
    from trainsentry.state import StateDB
    from trainsentry.store import Store

    paths = _existing(args.paths or ["."])
    routes = _routes(args)
    engine = Engine(_load_rules(args.rules))
    state_dir = Path(args.state_dir) if args.state_dir else default_state_dir()
    try:
        state = StateDB(state_dir / "state.db")
        outbox = Outbox(state_dir / "state.db")
    except Exception as exc:
        raise UsageError(f"cannot open state dir {state_dir}: {exc}") from None
    store = Store()
    alerts_jsonl = Path(args.alerts_jsonl) if args.alerts_jsonl else None
    since = time.time() - args.history
    printer = AlertPrinter(since=since, jsonl_path=alerts_jsonl)

    def run_meta(run: str) -> dict[str, object]:
        directory = daemon.run_dir(run)
        return {
            "run": run,
            "dir": str(directory) if directory else None,
            "files": [str(p) for p in daemon.run_files(run)],
            "series": {
                tag: {"points": s.count, "segments": s.segment + 1, "last_step": s.last.step}
                for tag, s in sorted(store.series(run).items())
            },
        }

    notifier = Notifier(
        routes,
        outbox,
        state_dir=state_dir,
        store=store,
        rule_of=lambda name: next((r for r in engine.rules if r.name == name), None),
        run_dir=lambda run: daemon.run_dir(run),
        run_meta=run_meta,
        since=since,
        link_template=args.link_template,
        control_dir=Path(args.control_dir).absolute() if args.control_dir else None,
    )

    def deliver(transitions: list[Transition]) -> None:
        printer(transitions)
        notifier.submit(transitions)

    def evaluate(points: list[Point]) -> None:
        store.extend(points)
        deliver(engine.feed_all(points))

    def print_points(points: list[Point]) -> None:
        text = "".join(json.dumps(p.as_dict()) + "\n" for p in points)
        with signals_deferred():
            sys.stdout.write(text)
            sys.stdout.flush()

    def released(run: str) -> None:
        deliver(engine.finish(run, "run deleted"))
        store.release_run(run)

    def on_cycle() -> None:
        deliver(engine.tick(time.time()))
        notifier.tick()

    sinks = [evaluate, print_points] if args.verbose >= 2 else [evaluate]
    daemon = Daemon(
        paths,
        state,
        sinks,
        poll=args.poll,
        on_release=released,
        on_cycle=on_cycle,
    )
    on_stop(daemon.stop)
    where = ", ".join(str(p) for p in paths)
    print(
        f"trainsentry {__version__}: watching {where} with {len(engine.rules)} rules "
        f"(state in {state_dir})",
        flush=True,
    )
    for lane in notifier.lanes.values():
        if lane.route.kind != "command":
            print(f"trainsentry: notifying {lane.sink.name}", flush=True)
    notifier.start()
    try:
        daemon.run_forever()
    finally:
        printer.close()
        notifier.close()
    hidden = f", {printer.hidden} historical transition(s) not shown" if printer.hidden else ""
    print(
        f"trainsentry: stopped after reading {daemon.stats.points} points "
        f"from {daemon.stats.files} files{hidden}",
        flush=True,
    )
    return 0


def cmd_notify_test(args: argparse.Namespace) -> int:
    from trainsentry.alerts.sample import send_sample

    args.notify = args.urls
    routes = _routes(args)
    if not routes:
        raise UsageError("give at least one URL or --alertmanager URL")
    failed = 0
    for name, result in send_sample(routes, args.link_template):
        if result.ok:
            print(f"ok      {name}")
        else:
            failed += 1
            kind = "retryable" if result.retryable else "not retryable"
            print(f"FAILED  {name}: {result.error} ({kind})")
    return 1 if failed else 0


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
        type=_positive_float,
        default=10.0,
        metavar="SECONDS",
        help="connect/read timeout of each send (default 10)",
    )


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
    notify = run.add_argument_group("notifications")
    _route_arguments(notify)
    notify.add_argument(
        "--group-wait",
        type=_seconds,
        default=30.0,
        metavar="SECONDS",
        help="warnings wait this long to be batched per run (default 30; criticals go at once)",
    )
    notify.add_argument(
        "--repeat-interval",
        type=_seconds,
        default=4 * 3600.0,
        metavar="SECONDS",
        help="repeat a still-firing alert after this long (default 14400; 0: never)",
    )
    notify.add_argument(
        "--rate-limit",
        type=_rate,
        default=(10, 600.0),
        metavar="COUNT/SECONDS",
        help="at most COUNT messages per SECONDS per receiver (default 10/600; 'off')",
    )
    notify.add_argument(
        "--control-dir",
        metavar="DIR",
        help="write stop files under DIR/<run>/.trainsentry/ instead of the run directories",
    )
    run.set_defaults(func=cmd_run)

    test = sub.add_parser("notify-test", help="send a sample alert through routes, report each")
    test.add_argument("urls", nargs="*", metavar="URL", help="[warning:|critical:]apprise URL")
    _route_arguments(test, positional=True)
    test.set_defaults(func=cmd_notify_test)

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

    test = sub.add_parser("test", help="run rule unit tests (promtool-style, on a step axis)")
    test.add_argument("paths", nargs="+", metavar="FILE", help="test files or directories of them")
    test.add_argument("--junit", metavar="FILE", help="also write a JUnit XML report here")
    test.add_argument("-k", metavar="TEXT", help="only the cases whose name contains TEXT")
    test.add_argument(
        "-v", "--verbose", dest="list_passing", action="store_true", help="list passing cases too"
    )
    test.set_defaults(func=cmd_test)

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
    demo.set_defaults(func=cmd_demo)
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
