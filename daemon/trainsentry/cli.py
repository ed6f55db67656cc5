"""The `trainsentry` command. Parses arguments and wires modules; holds no logic of its own.

Every subcommand exits non-zero with a one-line reason on bad input (a
contract in DESIGN.md): errors are raised as UsageError and printed once.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import gc
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainsentry.arguments import build_parser

if TYPE_CHECKING:
    from trainsentry.alerts.route import Route
    from trainsentry.config import Config
    from trainsentry.point import ProbeMark
    from trainsentry.rules.model import RuleSet


class UsageError(Exception):
    """A problem the user can fix; printed as one line, exit status 2."""


def default_state_dir() -> Path:
    env = os.environ.get("TRAINSENTRY_STATE_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_STATE_HOME") or os.path.join(Path.home(), ".local", "state")
    return Path(xdg) / "trainsentry"


def _existing(paths: Sequence[str], what: str = "log path", also: str | None = None) -> list[Path]:
    """The paths, or a usage error naming the first missing one and what it should be.

    `also` is a name that is not a path but accepted where `what` is (`default`).
    """
    missing = [p for p in paths if p != also and not os.path.exists(p)]
    if missing:
        raise UsageError(f"no such file or directory: {missing[0]}; give an existing {what}")
    return [Path(p) for p in paths]


def _routes(args: argparse.Namespace, config: Config | None = None) -> list[Route]:
    """--notify and --alertmanager as routes; a bad one is a usage error naming it (masked)."""
    from trainsentry.alerts.route import RouteError, parse_alertmanager, parse_notify
    from trainsentry.config import Config

    config = config or Config()
    timeout = getattr(args, "notify_timeout", config.notify_timeout)
    timing: dict[str, Any] = {
        "group_wait": config.group_wait,
        "group_interval": config.group_interval,
        "repeat_interval": config.repeat_interval,
        "rate_limit": config.rate_limit,
        "timeout": timeout,
    }
    try:
        routes = [parse_notify(u, **timing) for u in (args.notify or [])]
        routes += [parse_alertmanager(u, timeout) for u in (args.alertmanager or [])]
    except RouteError as exc:
        raise UsageError(str(exc)) from None
    seen: set[str] = {r.receiver for r in config.routes}
    for route in routes:
        if route.receiver in seen:
            raise UsageError("the same notification URL is given twice")
        seen.add(route.receiver)
    return routes


def cmd_dump(args: argparse.Namespace) -> int:
    from trainsentry.sources.reading import iter_batches

    paths = _existing(args.paths)
    out = sys.stdout
    errors = 0
    on_empty, empty = _empty_paths()

    def on_error(msg: str) -> None:
        nonlocal errors
        errors += 1
        print(f"trainsentry: skipped {msg}", file=sys.stderr)

    if args.format == "csv":
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(["run", "tag", "step", "wall_time", "value"])
        for batch in iter_batches(paths, on_error, on_empty, _said_busy):
            writer.writerows(batch)
    else:
        dumps = json.dumps
        for batch in iter_batches(paths, on_error, on_empty, _said_busy):
            out.write("".join(dumps(p.as_dict()) + "\n" for p in batch))
    out.flush()
    if errors:
        print(f"trainsentry: {errors} corrupt record(s) skipped", file=sys.stderr)
    return NOTHING_READABLE if empty and len(empty) >= len({p.absolute() for p in paths}) else 0


def _said_busy(msg: str) -> None:
    """A log a writer holds locked: not read now, and no corrupt record."""
    print(f"trainsentry: not read: {msg}; read it again once the writer lets go", file=sys.stderr)


# The exit status of `dump` and `replay` when no path given holds a log they read: a
# script must not take that for a run with nothing to say (commands.md).
NOTHING_READABLE = 3


def _empty_paths() -> tuple[Callable[[str], None], list[str]]:
    """A callback that says a path holds nothing readable, and the list it fills."""
    empty: list[str] = []

    def on_empty(msg: str) -> None:
        empty.append(msg)
        print(f"trainsentry: {msg}", file=sys.stderr)

    return on_empty, empty


def _refused(errors: Sequence[str], where: str) -> UsageError:
    """Every located error on its own line, then the one-line reason to exit with."""
    for err in errors:
        print(err, file=sys.stderr)
    return UsageError(f"{len(errors)} error(s) in {where}, at the lines above; nothing was run")


def _load_rules(paths: list[str] | None) -> RuleSet:
    from trainsentry.rules.loader import RuleFileError, load_rules

    try:
        return load_rules(paths)
    except RuleFileError as exc:
        raise _refused(exc.errors, "rule files") from None


def cmd_check(args: argparse.Namespace) -> int:
    from trainsentry.rules.check import check_paths
    from trainsentry.rules.loader import DEFAULT_PACK

    _existing(args.paths, f"rule file or directory, or `{DEFAULT_PACK}`", also=DEFAULT_PACK)
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

    _existing(args.paths, "rule test file or directory")
    junit = Path(args.junit) if args.junit else None
    return run_tests(
        args.paths, out=sys.stdout, junit=junit, select=args.k, verbose=args.list_passing
    )


def cmd_demo(args: argparse.Namespace) -> int:
    from trainsentry.runtime.demo import run_demo

    keep = Path(args.keep) if args.keep else None
    if keep is not None and keep.exists() and any(keep.iterdir()):
        raise UsageError(f"--keep {keep}: the directory is not empty; give a new or empty one")
    return run_demo(
        out=sys.stdout, fast=args.fast, healthy_steps=args.steps, keep=keep, notify=args.notify
    )


def cmd_replay(args: argparse.Namespace) -> int:
    from trainsentry.backtest.replay import replay
    from trainsentry.sources.reading import iter_ends, iter_events, iter_points

    paths = _existing(args.paths)
    rules = _load_rules(args.rules)

    on_empty, empty = _empty_paths()

    def on_error(msg: str) -> None:
        print(f"trainsentry: skipped {msg}", file=sys.stderr)

    if args.compare_rules and not args.report:
        raise UsageError("--compare-rules needs --report FILE.html")
    if args.report:
        from trainsentry.backtest.report import build_report, write_report

        compare = _load_rules(args.compare_rules) if args.compare_rules else None
        probe_marks: list[ProbeMark] = []  # the probe's records, filled as points are read
        text = build_report(
            iter_points(paths, on_error, on_empty, _said_busy, probe_marks),
            rules,
            events=iter_events(paths, on_error),
            marks=probe_marks,
            compare=compare,
            label=", ".join(args.rules) if args.rules else "default pack",
            compare_label=", ".join(args.compare_rules or []),
            order="input",
            ends=iter_ends(paths),
        )
        write_report(Path(args.report), text)
        print(f"trainsentry: report written to {args.report}")
        return 0
    events = iter_events(paths, on_error)  # the text logs' events, for pattern rules
    marks: list[ProbeMark] = []  # the probe's end records, filled as the points are read
    replay(
        iter_points(paths, on_error, on_empty, _said_busy, marks), rules, out=sys.stdout,
        fmt=args.format,
        order="input", events=events, ends=iter_ends(paths), marks=marks,
    )  # fmt: skip
    return NOTHING_READABLE if empty and len(empty) >= len({p.absolute() for p in paths}) else 0


def _run_config(args: argparse.Namespace) -> Config:
    """The config file (or embedded defaults), then the flags given on the command line."""
    from trainsentry.config import ConfigError, load_config

    try:
        config = load_config(args.config)
    except ConfigError as exc:
        raise _refused(exc.errors, "the config") from None
    except FileNotFoundError:
        raise UsageError(f"no such config file: {args.config}") from None
    return _with_flags(args, config)


def _reread(args: argparse.Namespace) -> Config:
    """What a SIGHUP reloads: the config file again, with the same flags on top (a
    `--rules` given at start must not be lost to the file's `rules`)."""
    from trainsentry.config import ConfigError, load_config

    try:
        return _with_flags(args, load_config(args.config))
    except (UsageError, FileNotFoundError) as exc:
        raise ConfigError([str(exc)]) from None


def _with_flags(args: argparse.Namespace, config: Config) -> Config:
    from trainsentry.config import HttpSettings
    from trainsentry.sources.shard import ShardError, parse_shard

    given = vars(args)
    changes: dict[str, object] = {}
    for key in (
        "history", "poll", "group_wait", "group_interval", "repeat_interval", "rate_limit",
        "notify_timeout",
    ):  # fmt: skip
        if key in given:
            changes[key] = given[key]
    if args.rules:
        changes["rules"] = tuple(args.rules)
    for key in ("state_dir", "control_dir"):
        if given.get(key):
            changes[key] = Path(given[key])
    if args.link_template:
        changes["link_template"] = args.link_template
    if args.shard:
        try:
            changes["shard"] = parse_shard(args.shard)
        except ShardError as exc:
            raise UsageError(f"--shard: {exc}") from None
    if args.http:
        if args.http == "off":
            changes["http"] = dataclasses.replace(config.http, enabled=False)
        else:
            host, _, port = args.http.rpartition(":")
            if not host or not port.isdigit():
                raise UsageError(f"--http: expected HOST:PORT or off, got {args.http!r}")
            changes["http"] = HttpSettings(
                host=host.strip("[]"),
                port=int(port),
                token=config.http.token,
                allow_unauthenticated=config.http.allow_unauthenticated,
                explicit=True,
            )
    config = dataclasses.replace(config, **changes)  # type: ignore[arg-type]
    routes = _routes(args, config)
    if routes:
        config = dataclasses.replace(config, routes=(*config.routes, *routes))
    return config


def cmd_run(args: argparse.Namespace) -> int:
    from trainsentry.runtime.service import Service, ServiceError

    config = _run_config(args)
    _load_rules(list(config.rules))  # the same errors and summary line as replay, before any I/O
    paths = _existing([str(p) for p in config.watch] if not args.paths else args.paths)
    if not paths:
        paths = [Path(".")]
    state_dir = config.state_dir or default_state_dir()
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(
            f"cannot create the state dir {state_dir}: {exc.strerror or exc}; "
            "give a writable one with --state-dir (or state_dir in the config)"
        ) from None
    alerts_jsonl = Path(args.alerts_jsonl) if args.alerts_jsonl else None
    try:
        service = Service(
            config,
            paths,
            state_dir,
            verbose=args.verbose,
            alerts_jsonl=alerts_jsonl,
            reread=lambda: _reread(args),
        )
        return service.run()
    except ServiceError as exc:
        if exc.status == 2:
            raise UsageError(str(exc)) from None
        print(f"trainsentry: {exc}", file=sys.stderr)  # one a restart cannot fix either
        return exc.status


def cmd_status(args: argparse.Namespace) -> int:
    from trainsentry.http_api import StatusError, fetch_status

    try:
        runs, alerts = fetch_status(args.address, os.environ.get("TRAINSENTRY_HTTP_TOKEN"))
    except StatusError as exc:
        raise UsageError(str(exc)) from None
    from trainsentry.terminal import render as console
    from trainsentry.terminal.plain import (
        given_up,
        loaded,
        nothing_readable,
        render_status,
        unreadable,
    )

    if console.is_rich(sys.stdout):
        screen = console.console_for(sys.stdout)
        console.print_status(screen, *loaded(runs, alerts), dropped=given_up(alerts))
        for line in [*nothing_readable(runs), *unreadable(runs)]:
            screen.print(line, style="yellow", markup=False, highlight=False)
    else:
        print(render_status(runs, alerts))
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


HANDLERS: dict[str, Callable[[argparse.Namespace], int]] = {
    "run": cmd_run,
    "status": cmd_status,
    "notify-test": cmd_notify_test,
    "dump": cmd_dump,
    "replay": cmd_replay,
    "check": cmd_check,
    "test": cmd_test,
    "demo": cmd_demo,
}


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
    from trainsentry.terminal import render as console  # rich itself is imported only when drawing

    console.set_color(getattr(args, "color", "auto"))
    try:
        return int(HANDLERS[args.command](args))
    except UsageError as exc:
        print(f"trainsentry: {exc}", file=sys.stderr)
        return 2
    except FileNotFoundError as exc:
        print(f"trainsentry: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:  # Ctrl-C in a long replay or dump: no traceback
        return 130
