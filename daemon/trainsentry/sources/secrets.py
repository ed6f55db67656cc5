"""Secrets in what jobs print, hidden before a line is kept, quoted or sent anywhere.

A training job's stdout is full of credentials by accident: a Hugging Face
token in a `huggingface-cli login` echo, an `Authorization: Bearer` header in
a failed request's debug log, a database URL with its password in an
exception, an AWS key in an environment dump. The daemon quotes log lines in
alerts, notifications and incident bundles, so every text line is masked as
it is decoded (sources/textlog.py), before the store, the rules or any sink
sees it: nothing downstream can leak what it never held.

What is masked: tokens of the shapes their issuers publish (`hf_`, `ghp_`/
`gho_`/`ghs_`/`github_pat_`, `sk-`/`sk-proj-`, `xox[abpr]-`, `AKIA`/`ASIA`
access key ids, JWTs), the value after `Bearer`/`Basic`/`token`, after
`password=`, `secret=`, `api_key=` and the like, and the password of
`user:pass@host` in URLs. The kind stays readable (`hf_****`) so a person
still sees which credential was exposed and can rotate it.
"""

from __future__ import annotations

import re

MASK = "****"

# Python's `\s` spelt out, so that RE2 (whose `\s` is ASCII) reads these patterns as
# Python does where it matters: the text scan (text_scan.py) runs them over whole
# reads to find the lines that need masking, and must find every one
_SPACE = "[\\s\x0b\x1c-\x1f\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]"

# (pattern, replacement): applied in order to each line
_SHAPES: tuple[tuple[str, str], ...] = (
    # user:password@ in a URL (https://user:pw@host, postgres://u:p@db)
    (r"(\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s:/@]+:)[^\s@/]+@", rf"\1{MASK}@"),
    # HTTP authorization headers and their look-alikes
    (rf"(?i)\b(bearer|basic)({_SPACE}+)[A-Za-z0-9._~+/=-]{{8,}}", rf"\1\2{MASK}"),
    # key=value and key: value pairs whose key says it is secret. Matched from the
    # key's word, not from the start of its name (`db_password`): the name's head is
    # kept as it is either way, and `\b[\w.-]*` before the word made a line of
    # `a-a-a-…-token` cost 80 ms in Python's re (every `-` a new start, each scanning on)
    (
        r"(?i)((?:password|passwd|pwd|secret|api[_-]?key|access[_-]?key|token)"
        rf"[\"']?{_SPACE}*[=:]{_SPACE}*[\"']?)([^\s\"',;&]{{3,}})",
        rf"\1{MASK}",
    ),
    # issuer-shaped tokens
    (r"\bhf_[A-Za-z0-9]{20,}", f"hf_{MASK}"),
    (r"\b(gh[pousr]_)[A-Za-z0-9]{20,}", rf"\1{MASK}"),
    (r"\bgithub_pat_[A-Za-z0-9_]{20,}", f"github_pat_{MASK}"),
    (r"\b(sk-(?:proj-|ant-)?)[A-Za-z0-9_-]{20,}", rf"\1{MASK}"),
    (r"\b(xox[abposr]-)[A-Za-z0-9-]{10,}", rf"\1{MASK}"),
    (r"\b(AKIA|ASIA)[A-Z0-9]{16}\b", rf"\1{MASK}"),
    (r"\beyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}", f"jwt-{MASK}"),
)
_RULES = tuple((re.compile(shape), replacement) for shape, replacement in _SHAPES)
# The shapes as RE2 reads them, a line that holds none of them needs no masking. RE2's
# `\b`, `\w` and negated `\s` are ASCII, Python's Unicode: each finds a match wherever
# Python's does (an ASCII word character has a boundary before it wherever Python
# sees one), so RE2 may send a line to be masked that needs none, never the reverse.
# A line cut at the line limit can match where the whole line does not (`AKIA...\b`
# at the cut): such a line is masked once cut, when its event is made (text_scan.py).
SECRET_SHAPES = tuple(shape for shape, _ in _SHAPES)
# A line with none of these cannot hold a secret of the shapes above: most lines
# skip the regexes altogether (a fleet's stdout is mostly progress bars). Searched in
# the lowered line: a case-blind alternation costs ~10x as much in Python's re (8.8
# against 0.8 µs a line, bench/ingest_text.py), and a hint may match more than it must.
_HINT = re.compile(r"://|bearer|basic|token|pass|pwd|secret|key|hf_|gh|sk-|xox|akia|asia|eyj")


def mask_secrets(line: str, after: str = "") -> str:
    """The line with every credential it shows replaced by ****, its kind kept. A line cut
    inside a word (`after`: the character that followed the cut, text_events.clean) loses
    that word's kept part to **** where the line holds a hint of one: the cut may leave a
    credential shorter than its shape needs to be recognised (`hf_` and 12 of its
    characters, a JWT's first two parts), and alerts quote lines, they do not archive
    them."""
    if _HINT.search(line.lower()) is None:
        return line  # nor a credential's first characters, up to its cut
    if after and not after.isspace() and not line[-1].isspace():
        line = line[: len(line) - len(line.rsplit(None, 1)[-1])] + MASK
    for pattern, replacement in _RULES:
        line = pattern.sub(replacement, line)
    return line
