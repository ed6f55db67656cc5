"""Text a job wrote, forwarded in a notification, made inert for the target's markup.

A log line, an exception, a run's name or a metric's tag is written by the
job, and holds whatever a dataset or a user put there: `<!channel>`,
`@everyone`, `<@U123>`, `[click](http://…)`, `![](http://…)`, `<img src=…>`.
Sent verbatim, Slack pages the channel, Discord pings everyone, a Markdown
chat shows a disguised link, an HTML mail runs the markup. The daemon's own
formatting (the bold headline, code spans, its link to the run) must still
render, so a message is built as `Marked` text: the daemon's markdown with the
spans the job wrote kept apart, and each sink renders it for its target at
the boundary, once it knows what the target does with markup:

- Slack (mrkdwn): `<`, `>`, `[`, `]` escaped for apprise's CommonMark → mrkdwn
  step, which makes `<`, `>`, `&` entities and `[x](y)` plain text; mentions
  broken. Slack has no escape for `*`, `_`, `~`: the job's emphasis may show,
  which can style its own text and no more.
- Markdown, and any apprise service sent text (Discord, Telegram, Mattermost,
  Matrix, ntfy, ...; a text service may still render Markdown, as Mattermost
  does): what starts a link, image, autolink, emphasis, code or block escaped
  with a backslash; mentions broken.
- HTML (email): the same escapes, then `&`, `<`, `>` made entities, for
  apprise's Markdown → HTML step; mentions broken except in mail.
- data (`json://`, `form://`, `xml://`; Alertmanager and `--alerts-jsonl` read
  the notices, not this text): exact. A receiver of data gets what the job
  wrote, and escapes it for whatever it renders into.

A mention is broken by a zero-width space after its `@` (`@\u200beveryone`,
`<@\u200bU123>`): no service reads it as one, and it still reads the same.
Slack's `<!channel>` has its `<` made an entity, and a zero-width space
after it besides, so that not even a code span's text is one. Discord's
`allowed_mentions` would say the same for Discord alone, but apprise's Discord
plugin has no setting for it.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

Markup = Literal["slack", "markdown", "html", "none"]

_ZWSP = "\u200b"
# `@here`, `@everyone`, `@channel`, `@all`, `@room`, `<@U123>`, `<@&role>`, `<@!id>`
_MENTION = re.compile(r"@(?=[\w!&])")
# Slack's `<!channel>`, `<!subteam^ID>`, `<#C123>`, `<@U123>`: broken after the `<` as
# well, so that not even a code span's text can be one
_SLACK_FORM = re.compile(r"<(?=[!#@])")
_SLACK_CODE_BREAKER = re.compile(r"[`\\]")
# What starts markup anywhere in a line, for each markup: escaped with a backslash.
# Links and images need `[`; autolinks and HTML `<`; emphasis, code and strikes their
# delimiters. A `(`, `!` or `.` alone starts nothing, and stays as it is, so the
# escaped text still reads as the line on a service that shows Markdown as text.
_INLINE = {
    "markdown": re.compile(r"([\\`*_\[\]<>~|])"),
    "html": re.compile(r"([\\`*_\[\]~|])"),  # `<`, `>`, `&` become entities after
    # Slack has no escape for emphasis (a `\*` shows its backslash), and apprise makes
    # `&` an entity itself: only what makes a mention, a link or a code span is escaped
    # (a code span opened by the job would take the daemon's fence, and what follows it
    # would be sent with a bare `<`), and a backslash where apprise reads an escape
    "slack": re.compile(r"([<>\[\]`]|\\(?=[\\<>()\[\]!#*_~`]|\Z))"),
}
# ... and what starts a block at the start of a line: a heading, a list item, a
# setext underline; apprise's Slack step reads only a heading
_BLOCK_START = re.compile(r"(?m)^([ \t]*)([#+=-]|\d{1,9}(?=[.)]))")
_BLOCK = {"markdown": _BLOCK_START, "html": _BLOCK_START, "slack": re.compile(r"(?m)^([ \t]*)(#)")}
_ENTITY = re.compile(r"&(?=#?[0-9A-Za-z]{1,32};)")
_BACKTICKS = re.compile(r"`+")


@dataclass(frozen=True, slots=True)
class Forwarded:
    """A span of text the job wrote; `code`: shown as a code span (a run's name, a tag)."""

    text: str
    code: bool = False

    @property
    def exact(self) -> str:
        return f"`{self.text}`" if self.code else self.text


Part = str | Forwarded


class Marked(str):
    """The daemon's markdown with the job's spans kept apart; as a str, the exact text.

    A str, so everything that reads a message as it was written (logs, tests,
    data receivers) reads it unchanged; `parts` is for the sinks that render it
    into a markup. A plain str anywhere a `Marked` is taken is the daemon's own.
    """

    parts: tuple[Part, ...]

    def __new__(cls, *pieces: Part) -> Marked:
        parts: list[Part] = []
        for piece in pieces:
            if isinstance(piece, Marked):
                parts.extend(piece.parts)
            elif piece != "" and (not isinstance(piece, Forwarded) or piece.text):
                parts.append(piece)
        self = super().__new__(cls, "".join(_exact(p) for p in parts))
        self.parts = tuple(parts)
        return self

    def cut(self, limit: int, mark: str = "…") -> Marked:
        """At most `limit` characters of the exact text, `mark` ending what was cut."""
        if len(self) <= limit:
            return self
        room, kept = limit - len(mark), []
        for part in self.parts:
            exact = _exact(part)
            if len(exact) > room:  # cut inside: a code span's fence is cut off, its text is text
                kept.append(exact[:room] if isinstance(part, str) else Forwarded(exact[:room]))
                break
            kept.append(part)
            room -= len(exact)
        return Marked(*kept, mark)


def join(separator: str, items: Iterable[Part]) -> Marked:
    """`separator.join(items)` that keeps the job's spans apart."""
    pieces: list[Part] = []
    for i, item in enumerate(items):
        if i:
            pieces.append(separator)
        pieces.append(item)
    return Marked(*pieces)


def _exact(part: Part) -> str:
    return part if isinstance(part, str) else part.exact


@dataclass(frozen=True, slots=True)
class Target:
    """What a receiver does with markup: how forwarded text in its body and title is made inert."""

    body: Markup
    title: Markup
    mentions: bool  # break @everyone, <@U123>, ...

    def render(self, text: str, *, title: bool = False) -> str:
        if not isinstance(text, Marked):
            return text  # the daemon's own
        markup = self.title if title else self.body
        return "".join(p if isinstance(p, str) else self._inert(p, markup) for p in text.parts)

    def _inert(self, part: Forwarded, markup: Markup) -> str:
        text = _MENTION.sub("@" + _ZWSP, part.text) if self.mentions else part.text
        if markup == "slack":
            text = _SLACK_FORM.sub("<" + _ZWSP, text)
        if markup == "none":
            return f"`{text}`" if part.code else text
        if part.code and markup != "slack":
            return _code_span(text)
        if part.code and not _SLACK_CODE_BREAKER.search(text):
            return f"`{text}`"  # apprise makes its `&`, `<`, `>` entities
        # apprise's Slack step reads a backslash as an escape even in a code span (it
        # would close the span early, or never), so such a name is sent as text
        inert = _INLINE[markup].sub(r"\\\1", text)
        inert = _BLOCK[markup].sub(_escape_block, inert)
        if markup == "markdown":
            return _ENTITY.sub(r"\\&", inert)
        if markup == "html":  # the Markdown → HTML step keeps entities as they are
            return html.escape(inert, quote=False)
        return inert


def _escape_block(match: re.Match[str]) -> str:
    indent, start = match.group(1), match.group(2)
    if start[0].isdigit():  # `1.` and `2)` start a list: the mark after the number is escaped
        return indent + start + "\\"
    return f"{indent}\\{start}"


def _code_span(text: str) -> str:
    """A code span holding `text` whole: its fence longer than any run of backticks in it.

    Inside a code span nothing is markup, and each converter escapes what its
    dialect needs (apprise: `&`, `<`, `>` for Slack; Python-Markdown for HTML).
    """
    longest = max((len(m) for m in _BACKTICKS.findall(text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


DATA = Target("none", "none", mentions=False)


def target_of(service: Any) -> Target:
    """How an apprise service takes the markdown the daemon sends (`body_format="markdown"`).

    apprise passes it to a Markdown service as Markdown (Slack's through its
    CommonMark → mrkdwn step), converts it to HTML for an HTML one (email), and
    sends it unchanged to a text one, whose service may still render Markdown
    (Mattermost does): so a text service is treated as Markdown. A title apprise
    blends into the body (`title_maxlen` 0: Telegram, Mattermost) is converted
    with it; Discord puts the title in its Markdown content; Slack's attachment
    title and a mail's subject are plain text, apprise escaping Slack's.
    """
    from apprise import NotifyFormat
    from apprise.plugins.custom_form import NotifyForm
    from apprise.plugins.custom_json import NotifyJSON
    from apprise.plugins.custom_xml import NotifyXML
    from apprise.plugins.email.base import NotifyEmail
    from apprise.plugins.slack import NotifySlack

    if isinstance(service, (NotifyJSON, NotifyForm, NotifyXML)):
        return DATA
    resolved = service.resolve_format(NotifyFormat.MARKDOWN)
    blended = getattr(service, "title_maxlen", 1) <= 0
    if isinstance(service, NotifySlack):
        if resolved == NotifyFormat.MARKDOWN:
            return Target("slack", "none", mentions=True)
        return Target("none", "none", mentions=True)  # ?format=text: apprise escapes &, <, >
    if resolved == NotifyFormat.HTML:
        return Target(
            "html", "html" if blended else "none", mentions=not isinstance(service, NotifyEmail)
        )
    return Target("markdown", "markdown", mentions=True)
