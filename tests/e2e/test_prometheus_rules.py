"""The fleet deployment in deploy/: Prometheus rules, their unit tests, the Grafana
dashboard, and the Alertmanager routing of the rules' alerts.

Across nodes no protocol of ours joins the daemons: Prometheus scrapes every
node's daemon and compares the ranks of a job in deploy/prometheus/
trainsentry-rules.yml, Alertmanager routes its alerts. These tests run the real
tools on those files: `promtool check` and `promtool test rules` (the
behaviour of each alert is specified in trainsentry-rules.test.yml), a real
Prometheus scraping an exposition of four ranks through deploy/prometheus.yml,
and a real Alertmanager with deploy/alertmanager.yml. `.ci/run` installs
Debian's prometheus and prometheus-alertmanager; a test whose tool is missing is
skipped and says which. The checks on names need no tool: every PromQL
expression of the rules and the dashboard may name only the families the daemon
exports (the contract below) and the rules' own recordings.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.paths import REPO
from support.ports import free_port
from support.waiting import wait_until as until

DEPLOY = REPO / "deploy"
RULES = DEPLOY / "prometheus" / "trainsentry-rules.yml"
RULE_TESTS = DEPLOY / "prometheus" / "trainsentry-rules.test.yml"
PROMETHEUS_CONFIG = DEPLOY / "prometheus.yml"
ALERTMANAGER_CONFIG = DEPLOY / "alertmanager.yml"
DASHBOARD = DEPLOY / "grafana" / "trainsentry-jobs.json"

PROMTOOL = shutil.which("promtool")
PROMETHEUS = shutil.which("prometheus")
ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
AMTOOL = shutil.which("amtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="no promtool (apt-get install prometheus; .ci/run does)"
)
TOOL_TIMEOUT = 60  # seconds; a promtool run here takes about 2

# The families a daemon exports that these files may name: the per-rank ones of
# distributed jobs, and the daemon's own health families that may be shown beside them.
CONTRACT = {
    "trainsentry_rank_step",
    "trainsentry_rank_step_timestamp_seconds",
    "trainsentry_rank_step_duration_seconds",
    "trainsentry_rank_value",
    "trainsentry_rank_last_error_info",
    "trainsentry_ranks_not_exported",
    "trainsentry_run_state",
    "trainsentry_alerts_firing",
    "trainsentry_build_info",
    "trainsentry_heartbeat_age_seconds",
}
# Prometheus's own series of the alerts its rules evaluate (the dashboard's
# "Alerts firing" reads it).
PROMETHEUS_OWN = {"ALERTS"}

OPERATORS = {"and", "or", "unless", "bool", "offset", "atan2", "group_left", "group_right"}
NUMBERS = {"inf", "nan"}
STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
NAME = re.compile(r"(?<![\w.:$])[A-Za-z_:][\w:]*")


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects.

    A regex reading, not a parser: strings, label matchers, ranges, grouping
    label lists and Grafana variables are cut out first; of the identifiers
    left, those followed by "(" are functions or aggregations, and the
    operators' keywords are dropped. What remains are the selectors' names.
    """
    expr = STRINGS.sub('""', expr)
    expr = re.sub(r"\{[^}]*\}", " ", expr)
    expr = re.sub(r"\[[^\]]*\]", " ", expr)
    expr = GROUPING.sub(" ", expr)
    expr = re.sub(r"\$\{?\w+\}?", " ", expr)
    names = set()
    for match in NAME.finditer(expr):
        if expr[match.end() :].lstrip().startswith("("):
            continue
        if match.group().lower() not in OPERATORS | NUMBERS:
            names.add(match.group())
    return names


def rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text(encoding="utf-8"))["groups"]
    return [rule for group in groups for rule in group["rules"]]


def recorded() -> set[str]:
    return {rule["record"] for rule in rules() if "record" in rule}


def alerts() -> dict[str, dict[str, Any]]:
    return {rule["alert"]: rule for rule in rules() if "alert" in rule}


def promtool(*args: str | Path) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run(
        [PROMTOOL, *map(str, args)], capture_output=True, text=True, timeout=TOOL_TIMEOUT
    )


# --- The rules ---------------------------------------------------------------


@needs_promtool
def test_the_rules_pass_promtool_check() -> None:
    result = promtool("check", "rules", RULES)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules())} rules found" in result.stdout


@needs_promtool
def test_the_rules_pass_their_promtool_unit_tests() -> None:
    result = promtool("test", "rules", RULE_TESTS)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


@needs_promtool
def test_prometheus_yml_loads_the_rules_and_keeps_the_daemons_job_label() -> None:
    """`promtool check config` loads rule_files too, so a path gone wrong fails here.

    honor_labels: the rank families' `job` is the training job; without it,
    Prometheus would move it to `exported_job` and every job would be one.
    """
    result = promtool("check", "config", PROMETHEUS_CONFIG)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 1 rule files found" in result.stdout
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text(encoding="utf-8"))
    assert (PROMETHEUS_CONFIG.parent / config["rule_files"][0]).resolve() == RULES
    (scrape,) = config["scrape_configs"]
    assert scrape["honor_labels"] is True


def test_every_alert_routes_by_severity_and_says_what_it_saw() -> None:
    found = alerts()
    assert set(found) == {
        "TrainsentryRankStraggling", "TrainsentryNodeSlow", "TrainsentryRankStepSlow",
        "TrainsentryJobHung", "TrainsentryJobHungRankBehind", "TrainsentryRankLossDiverging",
    }  # fmt: skip
    for name, rule in found.items():
        assert rule["labels"]["severity"] in {"warning", "critical"}, name
        assert rule["labels"]["scope"] == "fleet", name
        assert {"summary", "description"} <= set(rule["annotations"]), name
        text = rule["annotations"]["summary"] + rule["annotations"]["description"]
        assert "$labels.job" in text and "$value" in text, name
    hung = {"TrainsentryJobHung", "TrainsentryJobHungRankBehind"}
    assert {n for n, r in found.items() if r["labels"]["severity"] == "critical"} == hung


def test_every_alert_has_a_unit_test_where_it_fires_and_one_where_it_does_not() -> None:
    cases = yaml.safe_load(RULE_TESTS.read_text(encoding="utf-8"))["tests"]
    checks = [check for case in cases for check in case["alert_rule_test"]]
    for name in alerts():
        outcomes = {bool(c["exp_alerts"]) for c in checks if c["alertname"] == name}
        assert outcomes == {True, False}, f"{name}: {outcomes}"


def test_the_contract_is_what_the_daemon_exports() -> None:
    exported = (REPO / "daemon" / "trainsentry" / "http_api" / "metrics.py").read_text()
    assert all(f'"{name}"' in exported for name in CONTRACT), CONTRACT


def test_the_rules_and_their_tests_name_only_the_contract_and_the_recordings() -> None:
    known = CONTRACT | recorded()
    for rule in rules():
        unknown = metric_names(rule["expr"]) - known
        assert not unknown, f"{rule.get('record') or rule.get('alert')}: {unknown}"
    cases = yaml.safe_load(RULE_TESTS.read_text(encoding="utf-8"))["tests"]
    inputs = {s["series"].split("{")[0] for case in cases for s in case["input_series"]}
    assert inputs <= CONTRACT, inputs - CONTRACT
    for case in cases:
        for check in case.get("promql_expr_test", []):
            assert metric_names(check["expr"]) <= known, check["expr"]


def test_the_name_reading_finds_selectors_and_nothing_else() -> None:
    """The regex behind the two checks on names, on the shapes they meet."""
    expr = (
        'sum by (job) (rate(foo_total{a="b", c=~"x|y"}[5m] offset 1h)) > on (job) group_left'
        ' 1.3e0 * clamp_min(bar:baz:median{job="$job"}, 600) or ALERTS and ${x} unless quux'
    )
    assert metric_names(expr) == {"foo_total", "bar:baz:median", "ALERTS", "quux"}


# --- The dashboard -----------------------------------------------------------


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text(encoding="utf-8"))


def panels(board: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel, those inside collapsed rows too."""
    found = []
    for panel in board["panels"]:
        found.append(panel)
        found.extend(panel.get("panels", []))
    return found


def expressions(board: dict[str, Any]) -> dict[str, list[str]]:
    """Each panel's title and its targets' PromQL."""
    return {p["title"]: [t["expr"] for t in p.get("targets", [])] for p in panels(board)}


def test_the_dashboard_has_a_datasource_and_a_job_variable() -> None:
    board = dashboard()
    assert 36 <= board["schemaVersion"] <= 41
    assert board["uid"] == "trainsentry-jobs"
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    job = variables["job"]
    assert job["type"] == "query"
    assert job["query"]["query"] == job["definition"] == "label_values(trainsentry_rank_step, job)"
    for panel in panels(board):
        if panel["type"] != "row":
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel
            for target in panel["targets"]:
                assert target["datasource"]["uid"] == "${datasource}", panel["title"]


def test_the_dashboard_shows_each_rank_against_the_job() -> None:
    wanted = {
        "Loss per rank": ['series="loss"', "job:trainsentry_rank_value:median"],
        "Step duration per rank": [
            "trainsentry_rank_step_duration_seconds{",
            "job:trainsentry_rank_step_duration_seconds:median",
        ],
        "Own time per rank (data_wait + forward_time)": [
            "rank:trainsentry_rank_own_time_seconds:sum",
            "job:trainsentry_rank_own_time_seconds:median",
        ],
        "Step per rank": ["trainsentry_rank_step{"],
        "GPU utilisation per rank": ['series="gpu_util"'],
        "Alerts firing": ["ALERTS{"],
        "Latest error lines": ["trainsentry_rank_last_error_info{"],
    }
    shown = expressions(dashboard())
    for title, parts in wanted.items():
        assert title in shown, f"no panel {title!r}"
        for part in parts:
            assert any(part in expr for expr in shown[title]), f"{title}: no {part}"
    # every panel is of the job chosen, but the count of ranks no daemon exports
    # (which has no job: it is what the daemons left out)
    for title, exprs in shown.items():
        for expr in exprs:
            assert 'job="$job"' in expr or title == "Ranks not exported (all daemons)", expr


def test_the_dashboard_names_only_the_contract_and_the_recordings() -> None:
    known = CONTRACT | recorded() | PROMETHEUS_OWN
    board = dashboard()
    queries = [expr for exprs in expressions(board).values() for expr in exprs]
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            inside = re.fullmatch(r"label_values\((.+),\s*\w+\)", variable["query"]["query"])
            assert inside is not None, variable
            queries.append(inside.group(1))
    assert len(queries) > 10
    for expr in queries:
        assert metric_names(expr), expr
        assert metric_names(expr) <= known, f"{expr}: {metric_names(expr) - known}"


# --- compose.yaml ------------------------------------------------------------


def test_compose_mounts_only_files_that_are_there() -> None:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text(encoding="utf-8"))
    mounted = []
    for service in compose["services"].values():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                mounted.append(source)
                if source != "../logs":  # the user's logs, made by them
                    assert (DEPLOY / source).exists(), source
    assert "./prometheus" in mounted and "./grafana/trainsentry-jobs.json" in mounted


# --- A real Prometheus scraping ranks through deploy/prometheus.yml ----------


def exposition(now: float) -> str:
    """A daemon's /metrics with 4 ranks of job "llm" on 2 nodes, each followed through
    two runs as the daemon exports them: its torchrun log (the job's own data_time, 0.2 ms:
    source "log") and the probe's files (a data_wait of 50 ms, forward_time: source "probe").
    Rank 3 straggles in the probe's forward_time."""
    ranks = [("0", "node-a", "0"), ("1", "node-a", "1"), ("2", "node-b", "0"), ("3", "node-b", "1")]
    runs = []  # (labels of a rank's run, its values by (series, source))
    for rank, node, local in ranks:
        forward = 0.6 if rank == "3" else 0.3
        for run, values in (
            (f"llm/attempt_0/{local}", {("data_wait", "log"): 0.0002}),
            (f"llm/rank{rank}", {("data_wait", "probe"): 0.05, ("forward_time", "probe"): forward}),
        ):
            labels = f'job="llm",rank="{rank}",node="{node}",attempt="0",run="{run}"'
            runs.append((labels, values))
    families = {
        "trainsentry_rank_step": 120,
        "trainsentry_rank_step_timestamp_seconds": now,
        "trainsentry_rank_step_duration_seconds": 1.0,
    }
    lines = []
    for family, value in families.items():
        lines.append(f"# TYPE {family} gauge")
        lines.extend(f"{family}{{{labels}}} {value}" for labels, _ in runs)
    lines.append("# TYPE trainsentry_rank_value gauge")
    for labels, values in runs:
        for (series, source), value in values.items():
            lines.append(
                f'trainsentry_rank_value{{{labels},series="{series}",source="{source}"}} {value}'
            )
    lines.append("# TYPE trainsentry_build_info gauge")
    lines.append('trainsentry_build_info{version="0.1.0"} 1')
    return "\n".join(lines) + "\n"


@pytest.fixture
def daemon_metrics() -> Iterator[tuple[int, list[str | None]]]:
    """A stand-in daemon's /metrics on a free port, and the Authorization headers it was sent."""
    body = exposition(time.time()).encode()
    authorizations: list[str | None] = []

    class Metrics(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            authorizations.append(self.headers.get("Authorization"))
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1], authorizations
    server.shutdown()
    server.server_close()


def query(port: int, promql: str) -> list[dict[str, Any]]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return list(json.loads(response.read())["data"]["result"])
    except OSError:
        return []


@pytest.mark.skipif(
    PROMETHEUS is None, reason="no prometheus binary (apt-get install prometheus; .ci/run does)"
)
@pytest.mark.timeout(120)
def test_a_real_prometheus_compares_the_ranks_of_a_scraped_daemon(
    tmp_path: Path, daemon_metrics: tuple[int, list[str | None]]
) -> None:
    """deploy/prometheus.yml as it is, but for the target and a 1 s cadence: the
    training job's `job` label survives the scrape, the rules record across the
    ranks, each source's on its own, and the straggler's alert goes pending on the
    slow rank only (in one median of both sources, every probe run would)."""
    target, authorizations = daemon_metrics
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text(encoding="utf-8"))
    config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    config["rule_files"] = [str(RULES)]
    del config["alerting"]
    config["scrape_configs"][0]["static_configs"] = [{"targets": [f"127.0.0.1:{target}"]}]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    assert PROMETHEUS is not None
    port = free_port()
    proc = subprocess.Popen(
        [
            PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn",
        ],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        pending = 'ALERTS{alertname="TrainsentryRankStraggling", alertstate="pending"}'
        until(lambda: query(port, pending), "the straggler's alert pending in Prometheus")
        steps = query(port, "trainsentry_rank_step")
        assert {s["metric"]["job"] for s in steps} == {"llm"}
        assert not any("exported_job" in s["metric"] for s in steps)
        assert {s["metric"]["run"] for s in steps} == {
            *(f"llm/rank{rank}" for rank in "0123"), "llm/attempt_0/0", "llm/attempt_0/1"
        }  # fmt: skip
        ((count,),) = [[s["value"][1]] for s in query(port, "job:trainsentry_ranks:count")]
        assert count == "4"  # each rank once, though two runs follow it
        medians = query(port, "job:trainsentry_rank_own_time_seconds:median")
        assert {s["metric"]["source"]: float(s["value"][1]) for s in medians} == {
            "log": pytest.approx(0.0002), "probe": pytest.approx(0.35)
        }  # fmt: skip
        (alert,) = query(port, pending)
        labels = ("job", "attempt", "rank", "node", "run", "source", "severity")
        assert {k: alert["metric"][k] for k in labels} == {
            "job": "llm", "attempt": "0", "rank": "3", "node": "node-b", "run": "llm/rank3",
            "source": "probe", "severity": "warning",
        }  # fmt: skip
        assert not query(port, 'ALERTS{alertname="TrainsentryNodeSlow"}')
        assert query(port, "up") and query(port, "up")[0]["metric"]["job"] == "trainsentry"
        assert set(authorizations) == {"Bearer change-me"}  # prometheus.yml's token
    finally:
        proc.terminate()
        proc.wait(timeout=30)


# --- deploy/alertmanager.yml -------------------------------------------------


@pytest.mark.skipif(
    AMTOOL is None, reason="no amtool (apt-get install prometheus-alertmanager; .ci/run does)"
)
@pytest.mark.parametrize(
    ("labels", "receiver"),
    [
        (["scope=fleet", "severity=critical", "job=llm", "attempt=0"], "team-pages"),
        (["scope=fleet", "severity=warning", "job=llm", "attempt=0"], "team-warnings"),
        (["severity=critical", "run=exp", "family=loss"], "team-pages"),
        (["severity=warning", "run=exp", "family=loss"], "team-warnings"),
    ],
)  # fmt: skip
def test_alertmanager_yml_routes_fleet_alerts_by_severity(labels: list[str], receiver: str) -> None:
    assert AMTOOL is not None
    result = subprocess.run(
        [
            AMTOOL, "config", "routes", "test", f"--config.file={ALERTMANAGER_CONFIG}",
            f"--verify.receivers={receiver}", *labels,
        ],
        capture_output=True, text=True, timeout=TOOL_TIMEOUT,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


def fleet_alert(name: str, severity: str, **labels: str) -> dict[str, Any]:
    return {"labels": {"alertname": name, "severity": severity, "scope": "fleet", **labels}}


@pytest.mark.skipif(
    ALERTMANAGER is None,
    reason="no Alertmanager binary (apt-get install prometheus-alertmanager; .ci/run does)",
)
@pytest.mark.timeout(120)
def test_alertmanager_yml_inhibits_within_a_job_only(tmp_path: Path) -> None:
    """A hung job mutes its own warnings, a slow node its own ranks' straggling;
    neither mutes another job's, nor the run-and-family inhibition the daemons'
    alerts had (a fleet critical, with no run, would match every fleet warning)."""
    assert ALERTMANAGER is not None
    port = free_port()
    proc = subprocess.Popen(
        [
            ALERTMANAGER, f"--config.file={ALERTMANAGER_CONFIG}",
            f"--storage.path={tmp_path / 'am'}", f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=", "--log.level=error",
        ],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}/api/v2"
    job = {"attempt": "0"}
    probe, log = {"source": "probe"}, {"source": "log"}
    sent = {
        "hang": fleet_alert("TrainsentryJobHung", "critical", job="llm", **job),
        "llm straggler": fleet_alert(
            "TrainsentryRankStraggling", "warning", job="llm", rank="3", node="node-b",
            run="llm/rank3", **job, **probe,
        ),
        "node": fleet_alert(
            "TrainsentryNodeSlow", "warning", job="mt", node="node-b", **job, **probe
        ),
        # a slow node mutes its ranks' straggling of either source
        "mt straggler on the slow node": fleet_alert(
            "TrainsentryRankStraggling", "warning", job="mt", rank="2", node="node-b",
            run="mt/attempt_0/0", **job, **log,
        ),
        "mt straggler elsewhere": fleet_alert(
            "TrainsentryRankStraggling", "warning", job="mt", rank="0", node="node-a",
            run="mt/rank0", **job, **probe,
        ),
        "run critical": {"labels": {"alertname": "loss_nan", "severity": "critical",
                                    "run": "exp", "family": "loss"}},
        "run warning": {"labels": {"alertname": "loss_plateau", "severity": "warning",
                                   "run": "exp", "family": "loss"}},
    }  # fmt: skip

    def status() -> dict[str, bool]:
        """Each sent alert: whether Alertmanager shows it inhibited."""
        try:
            with urllib.request.urlopen(f"{base}/alerts", timeout=5) as response:
                listed = json.loads(response.read())
        except OSError:
            return {}
        names = {json.dumps(a["labels"], sort_keys=True): k for k, a in sent.items()}
        return {
            names[json.dumps(a["labels"], sort_keys=True)]: bool(a["status"]["inhibitedBy"])
            for a in listed
        }

    try:
        until(lambda: _post(f"{base}/alerts", list(sent.values())), "the alerts accepted")
        muted = {"llm straggler", "mt straggler on the slow node", "run warning"}
        until(
            lambda: {k for k, v in status().items() if v} == muted,
            f"exactly {sorted(muted)} inhibited",
        )
        assert set(status()) == set(sent), status()
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _post(url: str, body: object) -> bool:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return bool(response.status == 200)
    except OSError:
        return False
