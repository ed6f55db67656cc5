"""Credentials a job prints are masked, their kind kept; ordinary lines pass untouched."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainsentry.sinks.masking import mask_secrets
from trainsentry.sources import secrets
from trainsentry.sources.text_events import MAX_LINE_CHARS
from trainsentry.sources.text_scan import PLAIN, plain_events
from trainsentry.sources.textlog import TextDecoder, record_event

MASKED = [
    ("Login with HF_TOKEN=hf_AbCdEfGhIjKlMnOpQrStUvWx", "Login with HF_TOKEN=****"),
    ("token hf_AbCdEfGhIjKlMnOpQrStUvWx saved", "token hf_**** saved"),
    (
        "git clone https://ghp_AbCdEfGhIjKlMnOpQrStUvWx0123@github.com/x",
        "git clone https://ghp_****@github.com/x",
    ),
    ("openai key sk-proj-AbCdEfGhIjKlMnOpQrStUvWx", "openai key sk-proj-****"),
    ("slack xoxb-123456789012-AbCdEfGh", "slack xoxb-****"),
    ("aws AKIAIOSFODNN7EXAMPLE in env", "aws AKIA**** in env"),
    ("-H 'Authorization: Bearer eyAbCdEfGhIjKl.mnop'", "-H 'Authorization: Bearer ****'"),
    (
        "db postgres://trainer:s3cr3t@db:5432/runs down",
        "db postgres://trainer:****@db:5432/runs down",
    ),
    ("mlflow password=hunter2 user=bob", "mlflow password=**** user=bob"),
    ('{"api_key": "abc123def"}', '{"api_key": "****"}'),
]


@pytest.mark.parametrize(("line", "shown"), MASKED)
def test_a_credential_in_a_log_line_is_masked_and_its_kind_kept(line: str, shown: str) -> None:
    assert mask_secrets(line) == shown


@pytest.mark.parametrize(
    "line",
    [
        "step 100 loss 2.31 tokens_per_second=5120 max_tokens: 2048",
        "token embedding of size 768; key padding mask applied",
        "https://pytorch.org/docs/stable/notes/cuda.html#environment-variables",
        "RuntimeError: mat1 and mat2 shapes cannot be multiplied (8x12 and 16x4)",
    ],
)
def test_an_ordinary_line_passes_untouched(line: str) -> None:
    assert mask_secrets(line) == line


@pytest.mark.parametrize(
    ("secret", "value_at"),
    [
        ("hf_AbCdEfGhIjKlMnOpQrStUvWx", 3),
        ("Bearer eyAbCdEfGhIjKlmnopqrstu", 7),
        ("password=hunter2hunter2", 9),
        ("eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV", 3),
        ("https://trainer:s3cr3tpassword@db:5432", 16),
    ],
)
def test_a_credential_the_line_limit_cuts_shows_none_of_itself(secret: str, value_at: int) -> None:
    """Cut anywhere in it, the kept characters may be too few for its shape (or, for a
    JWT, its third part is gone): once one character of the secret itself is on the
    line, the cut word is masked whole, in a plain line, a traceback's exception line and
    a structured record's message alike."""

    def cut_at(prefix: str, cut: int) -> str:  # the line limit falls `cut` characters into it
        return prefix + "x" * (MAX_LINE_CHARS - len(prefix) - cut - 1) + " " + secret

    for cut in range(1, len(secret)):
        data = "\n".join(
            [
                "step 1",
                cut_at("", cut),
                "Traceback (most recent call last):",
                cut_at("KeyError: ", cut),
            ]
        )
        decoder = TextDecoder()
        events = decoder.feed(f"{data}\n".encode(), at_eof=True, file_time=1.0).events
        events += decoder.let_go()  # the traceback, held for what may continue it
        shown = [x for e in events for x in (plain_events(e) if e.kind == PLAIN else [e])]
        record = record_event({"message": cut_at("", cut)}, 9, 1.0)
        assert record is not None
        cut_lines = [t for e in [*shown, record] for t in e.lines if "xxx" in t]
        assert len(cut_lines) == 3, cut
        if cut > value_at:
            assert all(t.endswith(" ****") for t in cut_lines), cut


def test_a_long_line_without_a_credentials_hint_is_quoted_up_to_its_cut() -> None:
    line = "q" * (MAX_LINE_CHARS + 50)
    [event] = TextDecoder().feed(f"{line}\n".encode(), at_eof=True, file_time=1.0).events
    assert [x.lines[0] for x in plain_events(event)] == ["q" * MAX_LINE_CHARS]


# The key=value shape as it was written before it was matched from the key's word: the
# name's head (`db_` of `db_password`) was part of the match, which made a line of
# `a-a-a-…-token` quadratic in Python's re. Both must mask every line the same.
_KEY_FROM_NAME = re.compile(
    r"(?i)\b([\w.-]*(?:password|passwd|pwd|secret|api[_-]?key|access[_-]?key|token)"
    rf"[\"']?{secrets._SPACE}*[=:]{secrets._SPACE}*[\"']?)([^\s\"',;&]{{3,}})"
)
_KEY_FROM_WORD = next(p for p in secrets._RULES if "password" in p[0].pattern)[0]


_PIECES = [
    "token", "Password", "pwd", "api-key", "API_KEY", "access_key", "secret", "db_", "my.",
    "-", ".", "_", "a", "x1", "=", ":", "'", '"', ",", "é", "hunt3r", " ", "\xa0",
]  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(_PIECES), max_size=30).map("".join))
def test_the_key_shape_masks_as_when_matched_from_the_name(line: str) -> None:
    assert _KEY_FROM_WORD.sub(r"\1****", line) == _KEY_FROM_NAME.sub(r"\1****", line)
