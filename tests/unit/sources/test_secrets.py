"""Credentials a job prints are masked, their kind kept; ordinary lines pass untouched."""

from __future__ import annotations

import pytest

from trainsentry.sinks.masking import mask_secrets

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
