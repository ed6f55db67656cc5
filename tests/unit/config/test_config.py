"""The daemon's config file: every error at once at file:line:col, the environment on top."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest
from support.daemon_process import DaemonProcess
from support.paths import REPO

from trainsentry.cli import build_parser
from trainsentry.config import ENV_OVERRIDES, Config, ConfigError, HttpSettings, load_config
from trainsentry.sources.shard import Shard

EXAMPLE = REPO / "deploy" / "trainsentry.example.yaml"
EXAMPLE_ENV = {
    "TRAINSENTRY_SLACK_URL": "slack://TokenA/TokenB/TokenC/#training",
    "TRAINSENTRY_PAGER_URL": "json://pager.example.com/hook",
    "TRAINSENTRY_ALERTMANAGER_URL": "http://alertmanager:9093",
}


def load(tmp_path: Path, text: str, env: dict[str, str] | None = None) -> Config:
    path = tmp_path / "trainsentry.yaml"
    path.write_text(text)
    return load_config(path, environ=env or {})


def errors_of(tmp_path: Path, text: str, env: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, text, env)
    return [e.replace(str(tmp_path / "trainsentry.yaml"), "cfg") for e in info.value.errors]


def test_no_file_gives_the_embedded_defaults() -> None:
    config = load_config(None, environ={})
    assert config == Config(http=HttpSettings())
    assert config.rules == ("default",) and config.poll is None and config.history == 3600.0
    assert (config.http.host, config.http.port, config.http.enabled) == ("127.0.0.1", 9465, True)


def test_the_shipped_example_loads_cleanly() -> None:
    config = load_config(EXAMPLE, environ=EXAMPLE_ENV)
    assert config.watch == (Path("/srv/training-logs"),)
    assert config.state_dir == Path("/var/lib/trainsentry")
    assert config.link_template == "http://localhost:6006/#scalars&regexInput={run}"
    slack, pager, am = config.routes
    assert (slack.kind, slack.min_severity) == ("apprise", "warning")
    assert pager.min_severity == "critical" and pager.match_labels == (("team", "vision"),)
    assert pager.repeat_interval == 3600.0 and slack.repeat_interval == 4 * 3600.0
    assert (am.kind, am.url) == ("alertmanager", "http://alertmanager:9093")
    assert config.http.explicit


def test_the_example_without_its_secrets_names_each_missing_variable() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(EXAMPLE, environ={})
    assert len(info.value.errors) == 3
    assert all("is not set" in e and str(EXAMPLE) in e for e in info.value.errors)
    assert "TRAINSENTRY_PAGER_URL" in info.value.errors[1]


def test_values_and_units_are_read(tmp_path: Path) -> None:
    config = load(
        tmp_path,
        """
watch: logs
rules: [default, extra.yaml]
poll: 10s
history: all
retention: 500
shard: 2/3
control_dir: ~/control
notify:
  group_wait: 1m
  repeat_interval: 0
  rate_limit: 5/1h
  timeout: 3
  routes: ["critical:json://localhost/x"]
""",
    )
    assert config.watch == (tmp_path / "logs",)  # relative to the config file
    assert config.rules == ("default", str(tmp_path / "extra.yaml"))
    assert config.poll == 10.0 and math.isinf(config.history) and config.retention == 500
    assert config.shard == Shard(2, 3)
    assert config.control_dir == Path.home() / "control"
    assert (config.group_wait, config.repeat_interval, config.rate_limit) == (60.0, 0.0, (5, 3600))
    (route,) = config.routes
    assert route.min_severity == "critical" and route.group_wait == 60.0 and route.timeout == 3.0


def test_every_error_is_reported_at_once_at_its_line_and_column(tmp_path: Path) -> None:
    errs = errors_of(
        tmp_path,
        """watch: [/logs]
pol: 10
history: soon
retention: 0
shard: 0/4
notify:
  repeat_intreval: 1h
  routes:
    - url: json://localhost/x
      severity: urgent
""",
    )
    assert errs == [
        "cfg:2:1: unknown key `pol`; did you mean `poll`?",
        "cfg:3:10: `history`: expected seconds or a duration like `30s`, `5m`, `4h`, `2d`,"
        " got 'soon'",
        "cfg:4:12: `retention`: expected greater than or equal to 1, got 0",
        "cfg:5:8: `shard`: expected `i/n` with 1 <= i <= n, like `1/4`; "
        "shard 0 of 4 does not exist (shards are numbered 1..4)",
        "cfg:7:3: unknown key `notify.repeat_intreval`; did you mean `repeat_interval`?",
        "cfg:10:17: `notify.routes[0].severity`: expected 'warning' or 'critical', got 'urgent'",
    ]


def test_checkpoint_names_say_where_the_step_is_or_are_refused_at_the_key(
    tmp_path: Path,
) -> None:
    config = load(tmp_path, 'checkpoint_names: ["weights-{step}.bin", "snapshot_*_{step}"]\n')
    assert config.checkpoint_names == ("weights-{step}.bin", "snapshot_*_{step}")
    assert errors_of(tmp_path, 'checkpoint_names: ["weights.bin"]\n') == [
        "cfg:1:19: `checkpoint_names`: expected a checkpoint's name with `{step}` in it:"
        " 'weights.bin': say where the step is with `{step}`, once"
    ]
    [error] = errors_of(tmp_path, "checkpoint_names: ['out/{step}']\n")
    assert "`checkpoint_names`: " in error and "(no `/`, no other `{...}`)" in error


def test_an_unknown_key_without_a_close_match_lists_the_keys(tmp_path: Path) -> None:
    (err,) = errors_of(tmp_path, "http:\n  frobnicate: 1\n")
    assert err.startswith("cfg:2:3: unknown key `http.frobnicate`; expected one of: address,")


def test_yaml_syntax_errors_and_wrong_shapes_are_located(tmp_path: Path) -> None:
    assert errors_of(tmp_path, "watch: [a\npoll: 1\n")[0].startswith("cfg:2:")
    assert errors_of(tmp_path, "- a\n- b\n") == [
        "cfg:1:1: expected a mapping of settings (`watch:`, `rules:` ...)"
    ]


def test_a_missing_file_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "nope.yaml", environ={})
    assert info.value.errors == [
        f"{tmp_path / 'nope.yaml'}:1:1: cannot read: No such file or directory"
    ]


def test_secrets_come_from_the_environment_or_a_file(tmp_path: Path) -> None:
    (tmp_path / "am_url").write_text("http://am.internal:9093\n")
    config = load(
        tmp_path,
        """
notify:
  routes:
    - url_env: HOOK
      match: {team: nlp}
  alertmanagers:
    - url_file: am_url
""",
        {"HOOK": "json://hooks.example.com/secret123456789"},
    )
    hook, am = config.routes
    assert hook.url == "json://hooks.example.com/secret123456789"
    assert hook.match_labels == (("team", "nlp"),)
    assert am.url == "http://am.internal:9093"
    assert "secret123456789" not in repr(config)
    assert "secret123456789" not in config.describe()


def test_an_alertmanager_resend_interval_is_its_routes_repeat_and_only_an_alertmanagers(
    tmp_path: Path,
) -> None:
    config = load(
        tmp_path,
        "notify:\n  alertmanagers:\n    - {url: 'http://am:9093', resend_interval: 15s}\n"
        "    - http://am2:9093\n",
    )
    fast, default = config.routes
    assert (fast.repeat_interval, fast.hold_resolve) == (15.0, 15.0)
    assert (default.repeat_interval, default.hold_resolve) == (60.0, 60.0)
    errs = errors_of(
        tmp_path, "notify:\n  routes:\n    - {url: 'json://h/x', resend_interval: 15s}\n"
    )
    assert errs and "resend_interval" in errs[0], errs


def test_secret_errors_point_at_the_key_and_never_print_the_secret(tmp_path: Path) -> None:
    errs = errors_of(
        tmp_path,
        """notify:
  routes:
    - url_file: missing.txt
    - url: no-scheme-secret-token-12345
    - url: json://a/b
      url_env: HOOK
  alertmanagers:
    - ftp://am
""",
        {"HOOK": "json://x"},
    )
    assert (
        errs[0] == f"cfg:3:17: `notify.routes[0].url_file`: cannot read {tmp_path}/missing.txt:"
        " No such file or directory"
    )
    assert errs[1].startswith(
        "cfg:5:7: `notify.routes[2]`: give one of `url`, `url_env`, not several"
    )
    assert len(errs) == 2  # shapes first: the URLs are judged once the shapes are right
    errs = errors_of(
        tmp_path,
        "notify:\n  routes:\n    - url: no-scheme-secret-token-12345\n"
        "  alertmanagers:\n    - ftp://am\n",
    )
    assert errs[0].startswith("cfg:3:7: `notify.routes[0]`: not a notification URL")
    assert errs[1].startswith("cfg:5:7: `notify.alertmanagers[0]`: not an Alertmanager URL")
    assert all("secret-token-12345" not in e for e in errs)


def test_a_route_apprise_does_not_know_is_an_error_at_its_line(tmp_path: Path) -> None:
    errs = errors_of(
        tmp_path,
        "notify:\n  routes:\n    - json://127.0.0.1:1/ok\n    - url: jsn://h/secret-token-12345\n",
    )
    assert errs == [
        "cfg:4:7: `notify.routes[1]`: jsn://(not an apprise URL): "
        "not a URL apprise knows (check the scheme)"
    ]


def test_the_same_receiver_twice_is_an_error(tmp_path: Path) -> None:
    errs = errors_of(
        tmp_path,
        "notify:\n  routes:\n    - json://h/x\n    - url: json://h/x\n      severity: critical\n",
    )
    assert errs == ["cfg:4:7: `notify.routes[1]`: the same notification URL as `notify.routes[0]`"]


def test_dollar_braces_expand_from_the_environment(tmp_path: Path) -> None:
    config = load(
        tmp_path,
        'watch: ["${ROOT}/runs", "${MISSING:-/default}", "${EMPTY:-/e}", "${EMPTY-/e}x", "$$y"]\n',
        {"ROOT": "/data", "EMPTY": ""},
    )
    expected = (Path("/data/runs"), Path("/default"), Path("/e"), tmp_path / "x", tmp_path / "$y")
    assert config.watch == expected
    assert errors_of(tmp_path, "state_dir: ${NOPE}/x\n") == [
        "cfg:1:12: `state_dir`: environment variable NOPE is not set "
        "(write `${NOPE:-default}` to give a default)"
    ]


def test_trainsentry_variables_replace_keys_and_their_errors_name_the_variable(
    tmp_path: Path,
) -> None:
    env = {
        "TRAINSENTRY_STATE_DIR": "state",
        "TRAINSENTRY_HTTP": "0.0.0.0:9100",
        "TRAINSENTRY_HTTP_TOKEN": "s3cret",
        "TRAINSENTRY_POLL": "off",
        "TRAINSENTRY_SHARD": "1/2",
        "TRAINSENTRY_WATCH": "/a:/b",
    }
    config = load(tmp_path, "state_dir: /from/file\npoll: 5\nhttp:\n  token_env: UNSET\n", env)
    assert config.state_dir == Path.cwd() / "state"  # relative to where it was started
    assert (config.http.host, config.http.port, config.http.token) == ("0.0.0.0", 9100, "s3cret")
    assert config.poll is None and config.shard == Shard(1, 2)
    assert config.watch == (Path("/a"), Path("/b"))
    assert "s3cret" not in repr(config)
    errs = errors_of(
        tmp_path, "poll: 5\n", {"TRAINSENTRY_POLL": "often", "TRAINSENTRY_RETENTION": "x"}
    )
    assert errs == [
        "environment variable TRAINSENTRY_POLL: `poll`: expected seconds or a duration like "
        "`30s`, `5m`, `4h`, `2d`, got 'often'",
        "environment variable TRAINSENTRY_RETENTION: `retention`: expected a valid integer, "
        "unable to parse string as an integer, got 'x'",
    ]
    assert set(ENV_OVERRIDES) >= {"TRAINSENTRY_STATE_DIR", "TRAINSENTRY_HTTP"}


def test_exposing_the_api_without_a_token_is_refused_unless_allowed(tmp_path: Path) -> None:
    assert errors_of(tmp_path, "http:\n  address: 0.0.0.0:9465\n")[0].startswith(
        "cfg:2:12: `http.address`: 0.0.0.0:9465 serves run names"
    )
    assert errors_of(tmp_path, "http: :9465\n")[0].startswith("cfg:1:7: `http.address`:")
    (tmp_path / "token").write_text("t0k3n\n")
    config = load(tmp_path, "http:\n  address: 0.0.0.0:9465\n  token_file: token\n")
    assert config.http.token == "t0k3n"
    config = load(tmp_path, "http: {address: '[::]:9465', allow_unauthenticated: true}\n")
    assert (config.http.host, config.http.token) == ("::", None)
    assert load(tmp_path, "http: localhost:1234\n").http.port == 1234
    assert not load(tmp_path, "http: off\n").http.enabled
    assert load(tmp_path, "http:\n").http == HttpSettings()  # keys commented out: defaults
    assert not load(tmp_path, "http: {}\n").http.explicit


def test_empty_sections_read_as_empty_but_an_empty_path_is_an_error(tmp_path: Path) -> None:
    config = load(tmp_path, "notify:\n  routes:\n  alertmanagers:\n")
    assert config.routes == ()
    assert load(tmp_path, "").rules == ("default",)
    assert errors_of(tmp_path, "watch: ['${UNSET-}']\n") == [
        "cfg:1:9: `watch[0]`: String should have at least 1 character"
    ]


@pytest.mark.parametrize(
    ("flag", "key", "text"),
    [
        ("--history", "history", "1h"),
        ("--history", "history", "all"),
        ("--poll", "poll", "2s"),
        ("--poll", "poll", "off"),
        ("--group-wait", "notify:\n  group_wait", "1m"),
        ("--repeat-interval", "notify:\n  repeat_interval", "2h"),
        ("--rate-limit", "notify:\n  rate_limit", "5/10m"),
        ("--notify-timeout", "notify:\n  timeout", "3s"),
    ],
    ids=lambda value: str(value).split()[-1],
)
def test_duration_flags_take_what_the_config_file_takes(
    tmp_path: Path, flag: str, key: str, text: str
) -> None:
    args = build_parser().parse_args(["run", flag, text])
    dest = flag.lstrip("-").replace("-", "_")
    config = load(tmp_path, f"{key}: {text!r}\n")
    assert getattr(args, dest) == getattr(config, dest)


def shows_old_alert(tmp_path: Path, *flags: str) -> bool:
    """Whether `run` shows a NaN logged ten minutes ago: within its history horizon or not."""
    run = tmp_path / "logs" / "exp"
    if not run.exists():
        run.mkdir(parents=True)
        start = time.time() - 600
        rows = [
            {"step": s, "time": start + s, "loss": 1.0 if s < 5 else math.nan} for s in range(9)
        ]
        (run / "m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = tmp_path / "trainsentry.yaml"
    config.write_text("history: 5m\nhttp: off\n")
    state = tmp_path / f"state{len(list(tmp_path.glob('state*')))}"
    daemon = DaemonProcess(
        str(run.parent),
        "--config",
        str(config),
        "--state-dir",
        str(state),
        *flags,
        merge_stderr=True,
    )
    try:
        daemon.wait_for_text("caught up")
    finally:
        daemon.stop()
    out = "".join(daemon.lines)
    assert ("FIRING" in out) != ("historical transition" in out), out
    return "FIRING" in out


def test_flags_win_over_the_environment_which_wins_over_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert not shows_old_alert(tmp_path)  # the file: 5m
    assert shows_old_alert(tmp_path, "--history", "1h")
    monkeypatch.setenv("TRAINSENTRY_HISTORY", "1h")
    assert shows_old_alert(tmp_path)
    assert not shows_old_alert(tmp_path, "--history", "5m")


def test_the_node_names_the_ranks_of_this_daemon(tmp_path: Path) -> None:
    assert load(tmp_path, "node: gpu-node-17\n").node == "gpu-node-17"
    assert load(tmp_path, "poll: 5\n").node is None  # the probe's host, else this host's name
    assert load(tmp_path, "node: a\n", {"TRAINSENTRY_NODE": "b"}).node == "b"
    [err] = errors_of(tmp_path, "node: two words\n")
    assert err.startswith("cfg:1:7: `node`:") and "two words" in err
