"""Plain lines passed on together: each is exactly the line event it would have been alone.

The oracle is the text decoder's per-line path: every line decoded, cleaned,
masked and grouped on its own. The decoder under test scans whole reads with
RE2 and makes one event of the lines between those that need Python; taken
apart (`plain_events`), its events must be the oracle's, line for line, for
hostile lines (secrets behind Unicode spaces, a level's name across column 80,
lines past the line limit, bytes that are not UTF-8, carriage returns, colours,
rank prefixes, tracebacks and c10d reports) read in any pieces.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from trainsentry.point import TextEvent
from trainsentry.sources.secrets import mask_secrets
from trainsentry.sources.text_events import MAX_LINE_CHARS, Grouped, Grouper, clean, level_of
from trainsentry.sources.text_scan import PLAIN, plain_events, plain_lines
from trainsentry.sources.textlog import TextDecoder
from trainsentry.store.log_lines import LogLines

LINES = [
    b"step 5 | loss 0.31 | 1500 samples/s",
    b"",
    b"   ",
    "\xa0\u3000".encode(),
    b"Traceback (most recent call last):",
    b'  File "train.py", line 9, in <module>',
    b"ValueError: bad batch",
    b"During handling of the above exception, another exception occurred:",
    b"[rank3]: Traceback (most recent call last):",
    b"[rank3]: RuntimeError: boom",
    b"[E ProcessGroupNCCL.cpp:475] [Rank 3] Watchdog caught collective operation timeout",
    b"terminate called after throwing an instance of 'c10::Error'",
    b"  what():  boom",
    b"frame #0: c10::Error::Error",
    "Authorization: Bearer\u2003abcdefgh12345".encode(),
    "password\xa0= hunter22".encode(),
    b"see https://user:pw@host/x with hf_" + b"a" * 25,
    b"key AKIA" + b"B" * 16 + b" and eyJ" + b"a" * 12 + b"." + b"b" * 12 + b"." + b"c" * 12,
    "K\u212aEY=secretvalue".encode(),
    b"tokens/s 1234 | throughput",
    b"x" * 75 + b"ERRORS in the head",
    b"WARNING:root:a parameter was renamed",
    b"\x1b[31mERROR\x1b[0m red",
    b"10%|#\r50%|##\r100%|###",
    b"caf\xc3\xa9 \xe2\x80\xa8 separated",
    b"bad \xff\xfe bytes",
    b"y" * (MAX_LINE_CHARS - 3) + b"AKIA" + b"Q" * 16 + b"Z",
    b"z" * (MAX_LINE_CHARS + 40) + b" ERROR",
    b"a" * (MAX_LINE_CHARS + 1),
]


def oracle(data: bytes, wall: float) -> list[TextEvent]:
    """Each line on its own: decoded, cleaned, masked and grouped line by line."""
    grouper, found = Grouper(), list[Grouped]()
    for number, raw in enumerate(data.split(b"\n")[:-1], 1):
        text, after = clean(raw.decode("utf-8", "replace"))
        grouper.push(number, mask_secrets(text, after), found, after)
    grouper.flush(found)
    out = []
    for g in found:
        level = "error" if g.kind != "line" else level_of(g.lines[0])
        out.append(TextEvent("", g.line, wall, tuple(g.lines), g.kind, level, "", g.cuts))
    return out


def each(events: list[TextEvent]) -> list[TextEvent]:
    return [x for e in events for x in (plain_events(e) if e.kind == PLAIN else [e])]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.sampled_from(range(len(LINES))), max_size=60),
    st.lists(st.integers(1, 4000), max_size=8),
)
def test_plain_lines_taken_apart_are_the_events_each_line_makes_alone(
    picks: list[int], cuts: list[int]
) -> None:
    data = b"".join(LINES[k] + b"\n" for k in picks)
    decoder, events, pending, at = TextDecoder(), [], b"", 0
    for size in [*cuts, len(data)]:
        pending += data[at : at + size]
        at += size
        got = decoder.feed(pending, at_eof=at >= len(data), file_time=1.0)
        pending = pending[got.consumed :]
        events += got.events
    events += decoder.let_go()
    assert each(events) == oracle(data, 1.0)


def test_progress_lines_are_one_event_and_a_line_that_needs_more_splits_them() -> None:
    progress = b"".join(b"step %d | loss 0.5\n" % k for k in range(1, 1001))
    data = progress + b"WARNING:root:slow step\n" + progress
    got = TextDecoder().feed(data, at_eof=True, file_time=1.0)
    assert [(e.kind, e.line) for e in got.events] == [(PLAIN, 1), ("line", 1001), (PLAIN, 1002)]
    lines = plain_events(got.events[2])
    assert (lines[-1].line, lines[-1].lines) == (2001, ("step 1000 | loss 0.5",))


def test_a_bundles_last_lines_are_a_plain_events_last_numbered_as_in_the_file() -> None:
    long = "q" * (MAX_LINE_CHARS + 5) + " token=hunter22"
    text = "\n".join(["first", *["step"] * 5, long, "", " ", "last"])
    event = TextEvent("/logs/x.log", 10, 1.0, (text,), PLAIN, run="x")
    assert plain_lines(event, 3) == [(15, "step"), (16, "q" * MAX_LINE_CHARS), (19, "last")]
    assert plain_lines(event, 100)[0] == (10, "first") and len(plain_lines(event, 100)) == 8
    ring = LogLines(per_run=2)
    ring.extend([event])
    assert [(x["line"], x["text"]) for x in ring.last("x")] == [
        (16, "q" * MAX_LINE_CHARS),
        (19, "last"),
    ]


def test_a_secret_behind_any_space_python_knows_is_found_by_the_scan_and_masked() -> None:
    """RE2's `\\s` is ASCII: the secrets' shapes spell Python's out, or a token after a
    no-break space would pass unmasked among plain lines."""
    spaces = [chr(c) for c in range(0x110000) if chr(c).isspace() and chr(c) not in "\n\r"]
    for space in spaces:
        data = f"step 1\nAuthorization: Bearer{space}abcdefgh12345\npassword{space}= hunter22\n"
        lines = [
            e.lines[0]
            for e in each(TextDecoder().feed(data.encode(), at_eof=True, file_time=1.0).events)
        ]
        assert lines == ["step 1", f"Authorization: Bearer{space}****", f"password{space}= ****"]
