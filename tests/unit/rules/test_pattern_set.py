"""Pattern rules on RE2: linear whatever the pattern, one scan for all, and a cut line that
never makes a match its whole line does not have."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

from trainsentry.point import TextEvent
from trainsentry.rules.loader import RuleFileError, load_rules
from trainsentry.rules.log_rules import LogEngine
from trainsentry.rules.pattern_set import PatternError, PatternSet, compile_regex
from trainsentry.sources.text_events import MAX_LINE_CHARS
from trainsentry.sources.text_scan import PLAIN, plain_events
from trainsentry.sources.textlog import LogDecoder, TextDecoder


def engine_with(tmp_path: Path, *regexes: str) -> LogEngine:
    """An engine with a pattern rule per regex, named r0, r1, ..."""
    path = tmp_path / "rules.yaml"
    rules = "".join(
        f"  - name: r{i}\n    severity: warning\n    pattern: {{regex: {json.dumps(r)}}}\n"
        for i, r in enumerate(regexes)
    )
    path.write_text("version: 1\nrules:\n" + rules)
    return LogEngine(load_rules([str(path)]))


def read(data: bytes, decoder: TextDecoder | LogDecoder | None = None) -> list[TextEvent]:
    """The events a real text decoder makes of `data`, placed in run "run"; plain lines
    passed on together taken as the line events they stand for."""
    decoder = decoder or TextDecoder()
    got = decoder.feed(data, at_eof=True, file_time=100.0)
    events = [x for e in got.events for x in (plain_events(e) if e.kind == PLAIN else [e])]
    events += decoder.let_go()
    for event in events:
        event.run, event.path = "run", "/logs/run/stdout.log"
    return events


def fired(engine: LogEngine, events: list[TextEvent]) -> list[tuple[str, str]]:
    return [(t.rule, t.log["lines"][0] if t.log else "") for t in engine.feed(events)]


def test_a_backtracking_pattern_runs_in_linear_time(tmp_path: Path) -> None:
    """`(a+)+$` takes Python's re days on forty a's and a `!`; RE2 has nothing to backtrack."""
    engine = engine_with(tmp_path, "(a+)+$")
    hostile = b"a" * 40 + b"!\n"
    assert fired(engine, read(hostile * 50 + b"a" * 40 + b"\n")) == [("r0", "a" * 40)]


def test_what_re2_cannot_run_is_refused_with_the_reason() -> None:
    reasons = {}
    for regex in ("(a)\\1", "foo(?!bar)", "(?<=x)y", "a++", "(?>ab)c", "end\\Z", "(x{999}){999}"):
        with pytest.raises(PatternError) as refused:
            compile_regex(regex)
        reasons[regex] = str(refused.value)
    assert reasons["(a)\\1"].startswith("a backreference (\\1) cannot be matched in linear time")
    assert reasons["foo(?!bar)"].startswith("lookaround ((?!) cannot be matched in linear time")
    assert reasons["(?<=x)y"].startswith("lookaround ((?<=) cannot")
    assert "RE2 never backtracks" in reasons["a++"] and "RE2 never backtracks" in reasons["(?>ab)c"]
    assert reasons["end\\Z"] == "\\Z is spelt \\z (the end of the text) in RE2"
    assert reasons["(x{999}){999}"].startswith("a repeat too large for RE2")


def test_a_refused_pattern_stops_the_rule_file_at_its_line(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(
        "rules:\n  - name: twice\n    severity: warning\n    pattern:\n      regex: '(\\w+) \\1'\n"
    )
    with pytest.raises(RuleFileError) as refused:
        load_rules([str(path)])
    [error] = refused.value.errors
    assert error.startswith(f"{path}:5:14: bad regex: a backreference (\\1)")


def test_the_set_says_which_patterns_match_in_their_order() -> None:
    together = PatternSet(["oom", "^step \\d+$", "(?i)nccl"])
    assert together.matching("step 10") == [1]
    assert together.matching("CUDA oom: NCCL said") == [0, 2]
    assert together.matching("a\nstep 3\nb") == [1]  # ^ and $ at each line of an event
    assert together.matching("nothing here") == []
    assert PatternSet([]).matching("anything") == []
    assert pickle.loads(pickle.dumps(together)).matching("nccl") == [2]


def test_a_line_with_a_lone_surrogate_is_still_judged(tmp_path: Path) -> None:
    engine = engine_with(tmp_path, "boom")
    event = TextEvent("/logs/run/x.log", 1, 100.0, ("boom \ud800 here",), run="run")
    assert [t.rule for t in engine.feed([event])] == ["r0"]


def test_the_cut_of_a_long_line_makes_no_anchored_match(tmp_path: Path) -> None:
    """Cut at MAX_LINE_CHARS, `a+$` would see a line of a's ending there; the whole line
    ends in `!`, so nothing may fire."""
    engine = engine_with(tmp_path, "(a+)+$", "a\\b", "a{1000}$")
    line = b"a" * (MAX_LINE_CHARS + 500) + b"!\n"
    [event] = read(line)
    assert len(event.lines[0]) == MAX_LINE_CHARS  # quoted as cut
    assert fired(engine, [event]) == []


def test_the_cut_makes_no_match_across_it_into_the_next_line(tmp_path: Path) -> None:
    engine = engine_with(tmp_path, "y\\n +boom")

    def traceback(name: bytes) -> list[TextEvent]:
        frame = b'  File "x.py", line 1, in ' + name + b"z\n    boom()\n"
        return read(b"Traceback (most recent call last):\n" + frame + b"ValueError: bad\n")

    assert fired(engine, traceback(b"y" * MAX_LINE_CHARS)) == []  # the line went on past y
    assert [rule for rule, _ in fired(engine, traceback(b"y" * 30))] == []  # ends in z
    engine = engine_with(tmp_path, "z\\n +boom")
    assert fired(engine, traceback(b"y" * MAX_LINE_CHARS)) == []  # its z was never read
    assert [rule for rule, _ in fired(engine, traceback(b"y" * 30))] == ["r0"]


def test_a_match_before_the_cut_or_in_a_later_line_still_fires(tmp_path: Path) -> None:
    engine = engine_with(tmp_path, "^ERROR (?P<what>\\w+)", "^ValueError: (?P<why>.+)$")
    long = b"ERROR overflow " + b"x" * (MAX_LINE_CHARS * 2) + b"\n"
    assert fired(engine, read(long)) == [("r0", long[:MAX_LINE_CHARS].decode())]
    frames = b"Traceback (most recent call last):\n  " + b"y" * (MAX_LINE_CHARS * 2) + b"\n"
    [event] = read(frames + b"ValueError: too long a frame above\n")
    assert event.cuts == ((1, "y"),)
    [(rule, said)] = fired(engine, [event])
    assert (rule, said) == ("r1", "ValueError: too long a frame above")


def test_a_cut_line_of_a_structured_record_keeps_its_cut(tmp_path: Path) -> None:
    engine = engine_with(tmp_path, "(a+)+$")
    record = {"level": "error", "message": "a" * (MAX_LINE_CHARS + 3) + "!"}
    events = read(json.dumps(record).encode() + b"\n", LogDecoder())
    [event] = [e for e in events if e.kind == "record"]
    assert event.cuts and fired(engine, [event]) == []


def test_a_held_event_keeps_its_cuts_across_a_restart() -> None:
    decoder = TextDecoder()
    head = b"Traceback (most recent call last):\n  " + b"z" * (MAX_LINE_CHARS + 5) + b"\n"
    decoder.feed(head, at_eof=False, file_time=100.0)
    restored = TextDecoder()
    restored.restore(decoder.snapshot())
    [event] = read(b"KeyError: 'z'\n", restored)
    assert event.cuts == ((1, "z"),) and event.lines[-1] == "KeyError: 'z'"


def test_the_rules_judge_a_plain_event_as_its_lines(tmp_path: Path) -> None:
    """One scan of the text; the line that matched is judged alone, with its own number.
    A regex anchored at the text's start (`\\A`) matches a line alone, not among others:
    its lines are judged one by one."""
    text = "step 1\nDisk quota exceeded on /ckpt\nstep 2"
    event = TextEvent("/logs/x.log", 40, 1.0, (text,), PLAIN, run="x")
    [fired] = engine_with(tmp_path, "quota exceeded").feed([event])
    assert fired.log is not None and fired.log["line"] == 41
    assert engine_with(tmp_path, "nothing like it").feed([event]) == []
    [anchored] = engine_with(tmp_path, "\\Astep 2").feed([event])
    assert anchored.log is not None and anchored.log["line"] == 42


def test_the_default_pack_fires_on_a_plain_event_as_on_its_lines() -> None:
    text = "step 1\nslurmstepd: error: *** JOB 12 ON n1 CANCELLED AT 2026-01-01T00:00:00 ***"
    event = TextEvent("/logs/x.log", 1, 1.0, (text,), PLAIN, run="x")
    alone = LogEngine(load_rules()).feed(plain_events(event))
    together = LogEngine(load_rules()).feed([event])
    assert [t.rule for t in together] == [t.rule for t in alone] == ["slurm_cancelled"]
