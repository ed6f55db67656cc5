"""Hostile and unusual input, against the real daemon process: nothing in a log directory,
a rule file or a receiver may blind it, lose a file's data, break a neighbour or leak.

Every case keeps a healthy run beside the hostile one whose NaN must still page:
the daemon seeing it is what "not blinded" means.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.daemon_process import DaemonProcess
from support.notify_endpoints import HttpReceiver, Request
from support.ports import free_port
from support.state_db import confirmed

from trainsentry.sinks.base import AMBIGUOUS_TRIES

NAN_RUN = '{"step": 1, "loss": 1.0}\n{"step": 2, "loss": NaN}\n'


def healthy_run_with_a_nan(logs: Path) -> None:
    (logs / "ok").mkdir(parents=True, exist_ok=True)
    (logs / "ok" / "metrics.jsonl").write_text(NAN_RUN)


def daemon(tmp: Path, *extra: str) -> DaemonProcess:
    return DaemonProcess(
        str(tmp / "logs"), "--state-dir", str(tmp / "state"), "--history", "all",
        *(extra if "--http" in extra else (*extra, "--http", "off")), merge_stderr=True,
    )  # fmt: skip


def pages_the_nan(d: DaemonProcess) -> None:
    d.wait_until(lambda: any("loss_non_finite" in x and " ok " in x for x in d.lines))


def test_a_fifo_named_like_a_log_is_never_opened(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    (logs / "pipe").mkdir(parents=True)
    os.mkfifo(logs / "pipe" / "metrics.jsonl")  # opened for reading, it would block for good
    healthy_run_with_a_nan(logs)
    d = daemon(tmp_path)
    try:
        pages_the_nan(d)
        said = d.wait_for_text("metrics.jsonl: not a regular file")
        assert str(logs / "pipe") in said
    finally:
        d.stop()  # SIGTERM is honoured: the loop never waited on the FIFO
    assert d.proc.returncode == 0


def test_a_file_symlinked_from_outside_the_roots_is_not_read_nor_quoted(tmp_path: Path) -> None:
    secret = tmp_path / "outside" / "shadow"
    secret.parent.mkdir()
    secret.write_text("root:SECRETHASH:19000:0:99999:7:::\nuser:OTHERSECRET:19000\n")
    logs = tmp_path / "logs"
    (logs / "evil").mkdir(parents=True)
    (logs / "evil" / "metrics.csv").symlink_to(secret)
    healthy_run_with_a_nan(logs)
    d = daemon(tmp_path)
    try:
        pages_the_nan(d)
        d.wait_for_text("outside the watched roots: not read")
    finally:
        d.stop()
    out = "".join(d.lines)
    assert "SECRETHASH" not in out and "OTHERSECRET" not in out
    dumped = subprocess.run(
        [sys.executable, "-m", "trainsentry", "dump", str(logs)], capture_output=True, text=True
    )
    assert "SECRET" not in dumped.stdout + dumped.stderr
    assert '"run": "logs/ok"' in dumped.stdout


def test_a_20_mb_line_is_skipped_and_counted_and_the_nan_after_it_pages(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    (logs / "big").mkdir(parents=True)
    with (logs / "big" / "metrics.jsonl").open("w") as f:
        f.write('{"step": 1, "loss": 1.0}\n')
        f.write('{"step": 2, "note": "' + "x" * (20 << 20) + '"}\n')
        f.write('{"step": 3, "loss": NaN}\n')
    d = daemon(tmp_path)
    try:
        d.wait_until(lambda: any("loss_non_finite" in x and " big " in x for x in d.lines))
        said = d.wait_for_text("a line longer than 16 MB")
    finally:
        d.stop()
    # the line's number (2), as `grep -n` gives it, not its byte offset (25)
    assert f"{logs / 'big' / 'metrics.jsonl'}:2: " in said


def scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}


def test_a_400_digit_step_is_a_bad_record_and_metrics_still_scrape(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    (logs / "huge").mkdir(parents=True)
    (logs / "huge" / "metrics.jsonl").write_text(
        '{"step": ' + "9" * 400 + ', "loss": 1.0}\n{"step": 5, "loss": 2.0}\n'
    )
    healthy_run_with_a_nan(logs)
    port = free_port()
    d = daemon(tmp_path, "--http", f"127.0.0.1:{port}")
    try:
        pages_the_nan(d)
        d.wait_for_text("step outside the 64-bit range")
        samples: dict[str, float] = {}
        d.wait_until(lambda: scrape(port).get("trainsentry_records_skipped_total") == 1)
        samples = scrape(port)
    finally:
        d.stop()
    assert samples["trainsentry_points_read_total"] == 3  # the huge run's good line, and ok's two


def test_a_million_tag_run_is_bounded_and_its_neighbour_still_pages(tmp_path: Path) -> None:
    """A new tag per line, past the series limit: memory and the saved state stay bounded,
    and a read holding nothing but values past the limit (the backlog's last slice, a live
    append) is passed over, not a crash of the loop."""
    logs = tmp_path / "logs"
    (logs / "wide").mkdir(parents=True)
    with (logs / "wide" / "metrics.jsonl").open("w") as f:
        f.writelines(f'{{"step": {i}, "m{i}": 1.0}}\n' for i in range(200_000))
    port = free_port()
    d = daemon(tmp_path, "--http", f"127.0.0.1:{port}")
    try:
        d.wait_for_text("caught up")
        d.wait_for_text("run wide has more than 10000 series")
        with (logs / "wide" / "metrics.jsonl").open("a") as f:  # live: a read of new tags only
            f.writelines(f'{{"step": {i}, "m{i}": 1.0}}\n' for i in range(200_000, 200_010))
        healthy_run_with_a_nan(logs)
        pages_the_nan(d)
        scraped: dict[str, float] = {}

        def every_value_past_the_limit_dropped() -> bool:  # /metrics is a snapshot: it may lag
            scraped.update(scrape(port))
            return scraped["trainsentry_values_dropped_total"] == 200_010 - 10_000

        d.wait_until(every_value_past_the_limit_dropped, what="all 190,010 values dropped")
        rss = scraped["process_resident_memory_bytes"]
    finally:
        d.stop()
    assert rss < 400 << 20  # 200,000 series unbounded were more than that
    assert (tmp_path / "state" / "alert-state.snapshot").stat().st_size < 20 << 20


def test_globs_with_many_stars_against_long_tags_do_not_stall_the_loop(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(
        "rules:\n"
        "  - {name: starry, tag: '*a*a*a*a*a*a*b', severity: warning, threshold: {above: 1e9}}\n"
        "  - {name: loss_nan, metric: loss, severity: critical, non_finite: {}}\n"
    )
    logs = tmp_path / "logs"
    (logs / "long").mkdir(parents=True)
    lines = [json.dumps({"step": 1, "a" * 50_000 + str(i): 1.0}) for i in range(8)]
    (logs / "long" / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    healthy_run_with_a_nan(logs)
    d = daemon(tmp_path, "--rules", str(rules))
    try:
        d.wait_until(lambda: any("loss_nan" in x and " ok " in x for x in d.lines))
    finally:
        d.stop()


def test_hostile_run_names_cannot_split_or_colour_an_alert_line(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    for name in ("evil\nFIRING critical forged", "red\x1b[31mrun"):
        (logs / name).mkdir(parents=True)
        (logs / name / "metrics.jsonl").write_text(NAN_RUN)
    d = daemon(tmp_path, "--alerts-jsonl", str(tmp_path / "alerts.jsonl"))
    try:
        d.wait_until(lambda: sum("loss_non_finite" in x for x in d.lines) >= 2)
    finally:
        d.stop()
    out = "".join(d.lines)
    assert "\x1b" not in out
    assert not any(x.startswith("FIRING critical forged") for x in d.lines)
    assert "evil\\x0aFIRING critical forged" in out and "red\\x1b[31mrun" in out
    runs = {json.loads(x)["run"] for x in (tmp_path / "alerts.jsonl").read_text().splitlines()}
    assert runs == {"evil\\x0aFIRING critical forged", "red\\x1b[31mrun"}


def environment_dumping_rule(tmp: Path, selector: str) -> tuple[Path, Path]:
    """A rule whose command action writes the environment it got to a file: (file, rules)."""
    seen, rules = tmp / "seen.json", tmp / "rules.yaml"
    script = f"import json, os; json.dump(dict(os.environ), open({str(seen)!r}, 'w'))"
    rules.write_text(
        f"rules:\n  - name: loss_nan\n    {selector}\n    severity: critical\n"
        "    non_finite: {}\n"
        f"    actions: [{{command: [{sys.executable!r}, -c, {script!r}]}}]\n"
    )
    return seen, rules


def test_a_nul_in_a_metric_name_reaches_a_command_action_escaped_and_it_runs(
    tmp_path: Path,
) -> None:
    seen, rules = environment_dumping_rule(tmp_path, "tag: 'lo*'")
    logs = tmp_path / "logs"
    (logs / "exp").mkdir(parents=True)
    (logs / "exp" / "metrics.jsonl").write_text('{"step": 1, "lo\\u0000ss": NaN}\n')
    d = daemon(tmp_path, "--rules", str(rules))
    try:
        d.wait_until(seen.exists)
    finally:
        d.stop()
    env = json.loads(seen.read_text())
    assert env["TRAINSENTRY_METRIC"] == "lo\\x00ss"
    assert "Traceback" not in "".join(d.lines)


def test_a_command_action_gets_a_minimal_environment_not_the_daemons_secrets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen, rules = environment_dumping_rule(tmp_path, "metric: loss")
    receiver = HttpReceiver()
    monkeypatch.setenv("HOOK_URL", f"json://{receiver.url}/hook/s3cr3tpath")
    monkeypatch.setenv("TRAINSENTRY_HTTP_TOKEN", "tokentokentoken")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "awsawsaws")
    healthy_run_with_a_nan(tmp_path / "logs")
    d = daemon(tmp_path, "--rules", str(rules), "--notify", "env:HOOK_URL")
    try:
        d.wait_until(seen.exists)
    finally:
        d.stop()
        receiver.close()
    env = json.loads(seen.read_text())
    assert env["TRAINSENTRY_RULE"] == "loss_nan" and "PATH" in env
    leaked = [v for v in env.values() if "s3cr3t" in v or "tokentoken" in v or "awsaws" in v]
    assert leaked == []
    assert "HOOK_URL" not in env and "AWS_SECRET_ACCESS_KEY" not in env
    assert "s3cr3tpath" not in "".join(d.lines)  # nor in the daemon's own log


def test_a_receiver_that_answers_after_the_timeout_gets_one_key_and_no_storm(
    tmp_path: Path,
) -> None:
    """Answering 200 1.5 s late to a 1 s timeout: a later send waits longer and is
    taken; every send carries the same idempotency key, so the receiver can drop the
    repeats, and there are few (each retry doubles the wait; a loaded machine may need
    one more, never a storm)."""

    def late(req: Request) -> int:
        time.sleep(1.5)
        return 200

    receiver = HttpReceiver(status=late)
    healthy_run_with_a_nan(tmp_path / "logs")
    d = daemon(tmp_path, "--notify", f"json://{receiver.url}/hook", "--notify-timeout", "1")
    try:
        assert receiver.wait_for(lambda reqs: len(reqs) >= 2, timeout=60)
        d.wait_until(lambda: len(confirmed(tmp_path / "state" / "state.db")) == 1)  # taken once
    finally:
        d.stop()
        receiver.close()
    keys = {r.headers.get("Idempotency-Key") for r in receiver.requests}
    assert 2 <= len(receiver.requests) <= AMBIGUOUS_TRIES
    assert len(keys) == 1 and None not in keys
    (key,) = keys
    assert all(f"notification {key}" in r.json()["message"] for r in receiver.requests)


def test_a_notification_dropped_for_good_is_said_and_counted_in_status(tmp_path: Path) -> None:
    answers = iter([500, 400])
    receiver = HttpReceiver(status=lambda req: next(answers, 400))
    healthy_run_with_a_nan(tmp_path / "logs")
    port = free_port()
    d = daemon(tmp_path, "--notify", f"json://{receiver.url}/hook", "--http", f"127.0.0.1:{port}")
    try:
        d.wait_for_text("notification(s) dropped")
        status = subprocess.run(
            [sys.executable, "-m", "trainsentry", "status", "--address", f"127.0.0.1:{port}"],
            capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
    finally:
        d.stop()
        receiver.close()
    assert "1 notification(s) given up in the last week" in status.stdout


def test_alertmanager_credentials_in_the_url_are_sent_as_basic_auth(tmp_path: Path) -> None:
    am = HttpReceiver()
    healthy_run_with_a_nan(tmp_path / "logs")
    d = daemon(tmp_path, "--alertmanager", f"http://alice:pa%3Ass@{am.url}")
    try:
        assert am.wait_for(lambda reqs: len(reqs) >= 1, timeout=60)
    finally:
        d.stop()
        am.close()
    import base64

    (first, *_) = am.requests
    assert first.path == "/api/v2/alerts"
    assert first.headers["Authorization"] == "Basic " + base64.b64encode(b"alice:pa:ss").decode()
    assert "pa%3Ass" not in "".join(d.lines) and "pa:ss" not in "".join(d.lines)


def test_a_run_directory_replaced_by_a_file_is_released(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    (logs / "exp").mkdir(parents=True)
    (logs / "exp" / "metrics.jsonl").write_text('{"step": 1, "loss": 1.0}\n')
    d = daemon(tmp_path, "-v")
    try:
        d.wait_for_text("following")
        (logs / "exp" / "metrics.jsonl").unlink()
        (logs / "exp").rmdir()
        (logs / "exp").write_text("not a directory any more\n")
        d.wait_for_text(f"released {logs / 'exp' / 'metrics.jsonl'}")
    finally:
        d.stop()
    assert "cannot stat" not in "".join(d.lines)


def test_an_alias_bomb_is_refused_by_check_in_bounded_memory(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.yaml"
    levels = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for prev, name in zip("abcdefgh", "bcdefghi", strict=True):
        levels.append(f"{name}: &{name} [{','.join([f'*{prev}'] * 9)}]")
    bomb.write_text("\n".join([*levels, "rules: *i"]) + "\n")  # 9^9 strings, expanded

    def small() -> None:  # expanded, the bomb needs gigabytes: it would die of this
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    done = subprocess.run(
        [sys.executable, "-m", "trainsentry", "check", str(bomb)],
        capture_output=True, text=True, timeout=60, preexec_fn=small,
    )  # fmt: skip
    assert done.returncode == 1
    assert done.stdout.startswith(f"{bomb}:1:14: expands to more than 100,000 values")


def test_an_alias_bomb_on_sighup_keeps_the_old_rules_and_the_loop(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text("rules:\n  - {name: loss_nan, metric: loss, severity: critical, "
                     "non_finite: {}}\n")  # fmt: skip
    logs = tmp_path / "logs"
    logs.mkdir()
    d = daemon(tmp_path, "--rules", str(rules))
    try:
        d.wait_for_text("with 1 rule ")
        levels = ['a: &a ["x","x","x","x","x","x","x","x","x"]']
        for prev, name in zip("abcdefgh", "bcdefghi", strict=True):
            levels.append(f"{name}: &{name} [{','.join([f'*{prev}'] * 9)}]")
        rules.write_text("\n".join([*levels, "rules: *i"]) + "\n")
        d.proc.send_signal(signal.SIGHUP)
        d.wait_for_text("reload failed; the old rules keep running")
        healthy_run_with_a_nan(logs)  # the loop goes on, with the old rule
        d.wait_until(lambda: any("loss_nan" in x and " ok " in x for x in d.lines))
    finally:
        d.stop()


def test_claimed_ranks_are_bounded_and_said(tmp_path: Path) -> None:
    """A file that claims rank 10^9 is a run of its own, said once; a log of 100,000 ranks'
    lines gives the first 4,096 a run each and keeps the rest in its own run."""
    logs = tmp_path / "logs"
    healthy_run_with_a_nan(logs)
    (logs / "job").mkdir()
    (logs / "job" / "rank_1000000000.jsonl").write_text(NAN_RUN)
    (logs / "job" / "slurm-7.out").write_text(
        "".join(f"[rank{r}]: step 1 of rank {r}\n" for r in range(100_000))
    )
    port = free_port()
    d = daemon(tmp_path, "--http", f"127.0.0.1:{port}")
    try:
        pages_the_nan(d)
        said = d.wait_for_text("names rank 1000000000, beyond the 999,999 a job has at most")
        d.wait_until(lambda: any("loss_non_finite" in x and " job " in x for x in d.lines))
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/runs", timeout=10) as answer:
            runs = json.loads(answer.read())
    finally:
        d.stop()
    assert "rank_1000000000.jsonl" in said
    ranked = [r for r in runs["runs"] if r["run"].startswith("job/rank")]
    assert len(ranked) == 4096


def test_a_backtracking_pattern_on_hostile_lines_does_not_hold_up_another_runs_alert(
    tmp_path: Path,
) -> None:
    """`(a+)+$` on forty a's and a `!` held Python's re, and the whole daemon, for days: the
    patterns run on RE2, linear in the line, so the NaN of the run beside it still pages."""
    rules = tmp_path / "rules.yaml"
    rules.write_text(
        "rules:\n"
        "  - {name: nested, severity: warning, pattern: {regex: '(a+)+$'}}\n"
        "  - {name: loss_nan, metric: loss, severity: critical, non_finite: {}}\n"
    )
    logs = tmp_path / "logs"
    (logs / "hostile").mkdir(parents=True)
    hostile = "a" * 40 + "!\n"
    log = logs / "hostile" / "stdout.log"
    log.write_text(hostile * 100)
    d = daemon(tmp_path, "--rules", str(rules))
    try:
        d.wait_for_text("caught up")
        with log.open("a") as f:  # more while it runs, then a line the pattern does match
            f.write(hostile * 100 + "a" * 3000 + "!\n" + "a" * 40 + "\n")
        healthy_run_with_a_nan(logs)
        d.wait_until(lambda: any("loss_nan" in x and " ok " in x for x in d.lines))
        d.wait_until(lambda: any("nested" in x and " hostile " in x for x in d.lines))
    finally:
        d.stop()
    assert d.proc.returncode == 0
    nested = [x for x in d.lines if " FIRING " in x and " nested " in x]
    assert len(nested) == 1 and nested[0].endswith("stdout.log:202)\n")  # not the cut line 201
