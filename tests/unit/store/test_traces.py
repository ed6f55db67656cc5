"""Runs' traces: masked as they are read, merged per run, bounded."""

from __future__ import annotations

from trainsentry.sources.run_trace import VALUE_CHARS, entry
from trainsentry.store.traces import RunTraces


def test_a_secret_in_a_trace_is_masked_and_a_long_value_cut() -> None:
    assert entry("api_key", "abcdef123456") == ("api_key", "****")
    assert entry("hub", "hf_" + "x" * 30) == ("hub", "hf_****")
    assert entry("lr", "0.001") == ("lr", "0.001")
    _key, value = entry("config", "y" * 10_000)
    assert len(value) == VALUE_CHARS and value.endswith("…")


def test_a_runs_trace_is_merged_as_read_and_bounded() -> None:
    traces = RunTraces(per_run=3)
    traces.add("r", {"params": {"lr": "0.1", "seed": "1"}})
    traces.add("r", {"tags": {"team": "a", "extra": "b"}, "params": {"lr": "0.2"}})
    assert traces.of("r") == {"params": {"lr": "0.2", "seed": "1"}, "tags": {"team": "a"}}
    assert traces.of("other") == {}
    traces.forget("r")
    assert traces.of("r") == {}
