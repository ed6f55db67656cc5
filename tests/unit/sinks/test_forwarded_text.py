"""Job text made inert for each markup, judged by the renderer apprise uses (Python-Markdown).

Whatever the job wrote, the HTML a message becomes holds no tag of the job's:
only the daemon's bold, paragraphs and line breaks; and the text reads as the
job wrote it. Per-service payloads are in tests/e2e/test_job_text_in_notifications.py.
"""

from __future__ import annotations

import html
import re

import apprise
from apprise import NotifyFormat
from apprise.conversion.format import markdown_to_html
from hypothesis import given, settings
from hypothesis import strategies as st

from trainsentry.sinks.forwarded_text import DATA, Forwarded, Marked, Target, join, target_of

MARKDOWN = Target("markdown", "markdown", mentions=True)
HTML_MAIL = Target("html", "none", mentions=False)
TAG = re.compile(r"</?([a-z0-9]+)")

lines = st.text(
    alphabet=st.sampled_from("abc 019#*_-+=.!()[]<>&;`~|\\@:/\t^"), min_size=1, max_size=40
).filter(lambda line: line.strip() != "")
job_text = st.lists(lines, min_size=1, max_size=4).map("\n".join)


def _tags(target: Target, text: str) -> list[str]:
    page = markdown_to_html(target.render(Marked("**bold** ", Forwarded(text))))
    return TAG.findall(page)


@settings(max_examples=300, deadline=None)
@given(job_text)
def test_job_text_makes_no_markup_of_its_own_in_markdown_or_html(text: str) -> None:
    for target in (MARKDOWN, HTML_MAIL):
        tags = _tags(target, text)
        assert tags.count("strong") == 2, (target, text, tags)  # the daemon's, opened and closed
        assert set(tags) <= {"p", "strong", "br"}, (target, text, tags)


@settings(max_examples=300, deadline=None)
@given(job_text)
def test_a_mail_shows_the_job_text_as_written(text: str) -> None:
    """As messages place it: after the daemon's words, never opening a paragraph."""
    page = markdown_to_html(HTML_MAIL.render(Marked("rule: ", Forwarded(text))))
    shown = html.unescape(re.sub(r"<br />|</?p>", "", page))

    def words(page: str) -> list[list[str]]:  # HTML collapses spaces and expands tabs
        return [line.split() for line in page.splitlines()]

    assert words(shown) == words(f"rule: {text}")


@settings(max_examples=300, deadline=None)
@given(job_text)
def test_slack_gets_no_anchor_mention_or_link_of_the_jobs(text: str) -> None:
    """Through apprise's own CommonMark → mrkdwn step: no `<` is left for Slack to read
    as `<!channel>`, `<@U…>` or `<url|label>`, and the daemon's bold stays."""
    slack = apprise.Apprise.instantiate("slack://T1JJ3T3L2/A1BRTD4JD/TIiajkdnlazkcOXrIdevi7FQ")
    target = target_of(slack)
    body = target.render(Marked("**rule:** ", Forwarded(text), " ", Forwarded(text, code=True)))
    sent = slack.dialect_convert(body, NotifyFormat.MARKDOWN)
    assert "<" not in sent, (text, body, sent)
    assert sent.startswith("*rule:* "), (text, sent)


def test_a_code_span_holds_a_name_with_backticks_whole() -> None:
    name = "run`s ``odd`` <!here>"
    page = markdown_to_html(HTML_MAIL.render(Marked("- run ", Forwarded(name, code=True))))
    [code] = re.findall(r"<code>(.*?)</code>", page)
    assert html.unescape(code) == name


def test_mentions_are_broken_for_chats_not_for_mail_nor_data() -> None:
    text = Marked(Forwarded("@here <@U1> <@&42> ops@example.com"))
    assert MARKDOWN.render(text).count("@\u200b") == 4
    assert "@\u200b" not in HTML_MAIL.render(text) and DATA.render(text) == str(text)


def test_as_a_str_it_is_the_exact_text_and_a_plain_str_is_the_daemons_own() -> None:
    marked = join(
        "\n", [Marked("**", Forwarded("a*b"), "**"), Marked("- ", Forwarded("t", code=True))]
    )
    assert marked == "**a*b**\n- `t`"
    assert MARKDOWN.render(marked) == "**a\\*b**\n- `t`"
    assert MARKDOWN.render("**own [link](http://x)**") == "**own [link](http://x)**"


def test_a_cut_title_keeps_the_job_text_apart() -> None:
    title = Marked("[CRITICAL] ", Forwarded("[x](http://e.vil/" + "a" * 200 + ")"))
    cut = title.cut(40)
    assert len(cut) == 40 and cut.endswith("…") and cut.startswith("[CRITICAL] [x](")
    assert MARKDOWN.render(cut).startswith("[CRITICAL] \\[x\\](http://e.vil/")


def test_each_apprise_service_gets_the_markup_it_renders() -> None:
    def of(url: str) -> Target:
        return target_of(apprise.Apprise.instantiate(url))

    assert of("json://127.0.0.1/hook") == DATA and of("form://127.0.0.1/") == DATA
    assert of("slack://T1JJ3T3L2/A1BRTD4JD/TIiajkdnlazkcOXrIdevi7FQ").body == "slack"
    assert of("slack://T1JJ3T3L2/A1BRTD4JD/TIiajkdnlazkcOXrIdevi7FQ?format=text").body == "none"
    assert of("discord://4174216298/JHMHI8qBe7bk2ZwO5U711o3dV_js") == MARKDOWN
    assert of("mmost://127.0.0.1/token") == MARKDOWN  # apprise says text; Mattermost renders it
    mail = of("mailto://127.0.0.1?from=a@example.com&to=b@example.com")
    assert mail == HTML_MAIL
    telegram_html = of("tgram://123456789:abcdefg_hijklmnop/1/?format=html")
    assert telegram_html == Target("html", "html", mentions=True)  # its title is in the body
