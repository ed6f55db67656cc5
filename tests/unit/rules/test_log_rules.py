"""Pattern rules on text events: firing, latching, resolving, and the run's life they set."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainsentry.point import TextEvent
from trainsentry.rules.loader import RuleFileError, load_rules
from trainsentry.rules.log_rules import LogEngine
from trainsentry.rules.model import RuleSet


def rules(tmp_path: Path, text: str) -> RuleSet:
    path = tmp_path / "rules.yaml"
    path.write_text("version: 1\nrules:\n" + text)
    return load_rules([str(path)])


def line(text: str, wall: float = 100.0, number: int = 1) -> TextEvent:
    return TextEvent("/logs/run/stdout.log", number, wall, tuple(text.split("\n")), run="run")


OOM = """
  - name: oom
    severity: critical
    pattern:
      regex: 'CUDA out of memory\\. Tried to allocate (?P<size>\\S+ \\S+)'
      ends_run: crashed
      cause: "CUDA OOM ({size})"
"""


def test_a_pattern_without_keep_firing_for_fires_until_its_run_ends(tmp_path: Path) -> None:
    engine = LogEngine(rules(tmp_path, OOM))
    [fired] = engine.feed(
        [line("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.")]
    )
    assert (fired.state, fired.metric, fired.labels) == ("firing", "log", {"size": "2.00 GiB."})
    assert fired.log == {
        "path": "/logs/run/stdout.log",
        "line": 1,
        "lines": [fired.message.split(" (")[0]],
    }
    assert engine.feed([line("epoch 3", wall=5000.0)]) == []  # later lines do not end a crash
    [ended] = engine.finish("run", "run deleted")
    assert (ended.state, ended.reason) == ("resolved", "run crashed: CUDA OOM (2.00 GiB.)")


def test_a_crash_ends_the_run_once_with_its_cause(tmp_path: Path) -> None:
    engine = LogEngine(rules(tmp_path, OOM))
    engine.feed([line("CUDA out of memory. Tried to allocate 20.00 MiB")])
    [(run, life)] = engine.ended
    assert (run, life.state, life.reason) == ("run", "crashed", "run crashed: CUDA OOM (20.00 MiB)")


def test_metrics_long_after_a_crash_mean_the_run_was_restarted(tmp_path: Path) -> None:
    engine = LogEngine(rules(tmp_path, OOM))
    engine.feed([line("CUDA out of memory. Tried to allocate 1 GiB", wall=100.0)])
    assert engine.saw("run", 50, 110.0) == []  # the last rows of the run that died
    [resolved] = engine.saw("run", 10, 1000.0)
    assert (resolved.state, resolved.reason) == ("resolved", "run restarted")
    life = engine.life("run")
    assert life is not None and life.state == "running"


def test_for_in_points_waits_for_that_many_matches_and_keep_firing_for_ends_it(
    tmp_path: Path,
) -> None:
    engine = LogEngine(
        rules(
            tmp_path,
            """
  - name: skips
    for: 3 points
    keep_firing_for: 60s
    pattern: {regex: 'OVERFLOW! Rank \\d+ Skipping step'}
""",
        )
    )
    skip = "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 64, reducing to 32"
    assert engine.feed([line(skip, 1.0), line(skip, 2.0)]) == []
    [fired] = engine.feed([line(skip, 3.0)])
    assert fired.state == "firing" and fired.value == 3.0
    assert engine.feed([line("step 10 loss 2.0", 30.0)]) == []
    [resolved] = engine.feed([line("step 20 loss 1.9", 63.0)])
    assert resolved.reason == "no longer logged for 1m"


def test_a_catch_all_stays_quiet_where_a_more_telling_rule_matched(tmp_path: Path) -> None:
    ruleset = rules(
        tmp_path,
        OOM
        + """
  - name: any_traceback
    severity: critical
    pattern: {regex: 'Traceback', fallback: true}
""",
    )
    engine = LogEngine(ruleset)
    fired = engine.feed(
        [
            line(
                "Traceback (most recent call last):\n"
                "RuntimeError: CUDA out of memory. Tried to allocate 1 GiB"
            )
        ]
    )
    assert [t.rule for t in fired] == ["oom"]
    assert [
        t.rule for t in engine.feed([line("Traceback (most recent call last):\nKeyError: 'x'")])
    ] == ["any_traceback"]


def test_a_level_filter_reads_only_records_of_that_level(tmp_path: Path) -> None:
    engine = LogEngine(
        rules(tmp_path, "  - name: errors\n    pattern: {regex: '.', level: error}\n")
    )
    info = TextEvent("app.log", 1, 1.0, ("INFO fine",), "record", "info", "run")
    error = TextEvent("app.log", 2, 2.0, ("ERROR upload failed",), "record", "error", "run")
    assert [t.message for t in engine.feed([info, error])] == ["ERROR upload failed (app.log:2)"]


def test_a_bad_regex_and_a_metric_on_a_pattern_are_reported_where_they_are(tmp_path: Path) -> None:
    with pytest.raises(RuleFileError) as caught:
        rules(
            tmp_path,
            "  - name: bad\n    pattern: {regex: 'oops('}\n"
            "  - name: mixed\n    metric: loss\n    pattern: {regex: 'x'}\n",
        )
    text = "\n".join(caught.value.errors)
    assert "rules.yaml:4:" in text and "bad regex" in text
    assert "rules.yaml:5:" in text and "a pattern reads the run's text logs" in text


def test_a_trackers_word_ends_the_run_unless_its_logs_told_how_first(tmp_path: Path) -> None:
    engine = LogEngine(rules(tmp_path, OOM))
    engine.saw("run", 40, 90.0)
    engine.reported("quiet", "crashed", "MLflow run status FAILED", 95.0)
    engine.feed([line("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB")])
    engine.reported("run", "crashed", "MLflow run status FAILED", 101.0)
    assert [(run, life.reason) for run, life in engine.ended] == [
        ("quiet", "run crashed: MLflow run status FAILED"),
        ("run", "run crashed: CUDA OOM (2 GiB)"),
    ]
    quiet = engine.life("quiet")
    assert quiet is not None and quiet.ended_wall == 95.0
    # metrics long after the tracker's end: the run was resumed, and runs again
    engine.saw("quiet", 50, 95.0 + 60)
    assert engine.life("quiet").state == "running"  # type: ignore[union-attr]
