"""A job's exception line that tries to page a channel, through the real daemon to each target.

The job's log ends in an exception line holding Slack's and Discord's
mentions, Markdown links and an image, HTML and an entity; its run directory
is named with a mention too. The daemon sends it to Slack, Discord, Telegram
(apprise's plugins pointed at a local receiver, support/services_at_localhost.py),
Mattermost and a JSON webhook (local receivers, as configured) and an SMTP server
(aiosmtpd). Each payload must page no one, carry no live link or markup of the
job's, and keep the daemon's own formatting; the JSON webhook, data, gets the
line exact.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.daemon_process import DaemonProcess
from support.notify_endpoints import HttpReceiver, Request, SmtpReceiver
from support.services_at_localhost import ENV

TESTS = Path(__file__).resolve().parents[1]
ATTACK = (
    "RuntimeError: <!channel> <!here> <!everyone> <@U024BE7LH> @here @everyone"
    " [click](http://e.vil/x) ![pic](http://e.vil/i.png) <img src=x onerror=alert(1)>"
    " a & b **loud**"
)
RUN = "job-@here"
SLACK = "/services/T1JJ3T3L2/A1BRTD4JD/TIiajkdnlazkcOXrIdevi7FQ"
DISCORD = "/api/webhooks/4174216298/JHMHI8qBe7bk2ZwO5U711o3dV_js"
DISCORD_EMBED = "/api/webhooks/4174216299/JHMHI8qBe7bk2ZwO5U711o3dV_js"  # ?format=markdown
TELEGRAM = "/bot123456789:abcdefg_hijklmnop/sendMessage"
MATTERMOST = "/hooks/mattermosttoken"
JSON = "/hook"
ZWSP = "\u200b"
# a mention the chat services read: an @ with no zero-width space after it
LIVE_MENTION = re.compile(r"@(here|everyone|channel|U024BE7LH)")
# ... and Slack's own, <!channel> and <@U…>, with a bare `<` (not an entity)
SLACK_MENTION = re.compile(r"<[!@]")


@pytest.fixture(scope="module")
def payloads(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """What each target got for the exception's page: the JSON body, and the mail."""
    tmp = tmp_path_factory.mktemp("job_text")
    slack, chats, smtp = HttpReceiver(reply=b"ok"), HttpReceiver(), SmtpReceiver()
    urls = [
        f"slack://{SLACK.removeprefix('/services/')}",
        f"discord://{DISCORD.removeprefix('/api/webhooks/')}",
        f"discord://{DISCORD_EMBED.removeprefix('/api/webhooks/')}?format=markdown",
        "tgram://123456789:abcdefg_hijklmnop/12315544/",
        f"mmost://{chats.url}/mattermosttoken",
        f"json://{chats.url}{JSON}",
        f"mailto://127.0.0.1:{smtp.port}?from=sentry@example.com&to=ops@example.com&mode=insecure",
    ]
    routes = "\n".join(f"    - url: {json.dumps(u)}" for u in urls)
    (tmp / "config.yaml").write_text(
        f"http: {{address: 'off'}}\nnotify:\n  group_wait: 0s\n  routes:\n{routes}\n"
    )
    run = tmp / "logs" / RUN
    run.mkdir(parents=True)
    (run / "train.log").write_text(
        "epoch 1\nTraceback (most recent call last):\n"
        '  File "train.py", line 3, in <module>\n' + ATTACK + "\n"
    )
    env = dict(os.environ)
    env[ENV] = f"http://{slack.url}"
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")])
    daemon = DaemonProcess(
        str(tmp / "logs"),
        "--config", str(tmp / "config.yaml"),
        "--state-dir", str(tmp / "state"),
        module="support.services_at_localhost",
        env=env,
        merge_stderr=True,
    )  # fmt: skip
    # Discord and Telegram go to the Slack receiver's address too: one base for the three
    got: dict[str, Any] = {}
    try:
        for path in (SLACK, DISCORD, DISCORD_EMBED, TELEGRAM):
            got[path] = _page(slack, path, daemon)
        for path in (MATTERMOST, JSON):
            got[path] = _page(chats, path, daemon)
        assert smtp.wait_for(1), "".join(daemon.lines[-20:])
        got["mail"] = smtp.mails[0]
    finally:
        daemon.stop()
        for server in (slack, chats, smtp):
            server.close()
    yield got


def _page(receiver: HttpReceiver, path: str, daemon: DaemonProcess) -> Any:
    def pages(requests: list[Request]) -> list[Request]:
        return [
            r
            for r in requests
            if r.path == path and b"[CRITICAL]" in r.body and b"python_exception" in r.body
        ]

    assert receiver.wait_for(lambda rs: bool(pages(rs))), (path, "".join(daemon.lines[-20:]))
    return pages(receiver.requests)[0].json()


def _no_live_markup(text: str) -> None:
    assert ATTACK.split(":")[0] in text
    assert not LIVE_MENTION.search(text), text
    assert f"@{ZWSP}here" in text and f"@{ZWSP}everyone" in text and f"@{ZWSP}U024BE7LH" in text


def test_slack_gets_entities_and_broken_mentions_and_keeps_its_bold(payloads: dict) -> None:
    [attachment] = payloads[SLACK]["attachments"]
    text, title = attachment["text"], attachment["title"]
    _no_live_markup(text)
    assert not SLACK_MENTION.search(text) and not SLACK_MENTION.search(title)
    assert f"&lt;{ZWSP}!channel&gt; &lt;{ZWSP}!here&gt; &lt;{ZWSP}!everyone&gt;" in text
    assert "&lt;img src=x onerror=alert(1)&gt;" in text and "a &amp; b" in text
    # no <url|label> anchor: the link is its text, the URL shown as it is
    assert "[click](http://e.vil/x)" in text and "|click>" not in text and "|pic>" not in text
    assert text.startswith("*python_exception: RuntimeError: ")  # the daemon's bold, as mrkdwn
    assert "- run `job-@\u200bhere`" in text
    _no_live_markup(title)
    assert title.startswith(f"[CRITICAL] job-@{ZWSP}here: python_exception: RuntimeError: &lt;!")


def test_discord_gets_markdown_escaped_and_mentions_broken(payloads: dict) -> None:
    content = payloads[DISCORD]["content"]
    _no_live_markup(content)
    assert "\\[click\\](http://e.vil/x) !\\[pic\\](http://e.vil/i.png)" in content
    assert "\\<img src=x onerror=alert(1)\\>" in content and "\\*\\*loud\\*\\*" in content
    assert "\n**python_exception: RuntimeError: \\<!channel\\>" in content  # own bold stays
    assert content.startswith(f"[CRITICAL] job-@{ZWSP}here: python_exception:")
    assert "allow_mentions" not in payloads[DISCORD]  # apprise added no mention of its own


def test_discord_embeds_find_no_mention_for_apprise_to_ping(payloads: dict) -> None:
    """With `?format=markdown` apprise reads the body for mentions and pings each it
    finds (a `👉 @everyone` content): the job's must not be found."""
    payload = payloads[DISCORD_EMBED]
    [embed] = payload["embeds"]
    _no_live_markup(embed["description"])
    assert "content" not in payload and "allow_mentions" not in payload
    assert embed["description"].startswith("**python_exception: RuntimeError: \\<!channel\\>")


def test_telegram_gets_its_markdown_escaped_and_keeps_the_bold_title(payloads: dict) -> None:
    payload = payloads[TELEGRAM]
    text = payload["text"]
    assert payload["parse_mode"] == "MARKDOWN"
    _no_live_markup(text)
    assert "\\[click\\](http://e.vil/x) !\\[pic\\](http://e.vil/i.png)" in text
    assert "\\*\\*loud\\*\\*" in text
    assert text.startswith(f"*[CRITICAL] job-@{ZWSP}here: python_exception:")
    assert "\n*python_exception: RuntimeError: " in text


def test_mattermost_renders_markdown_and_gets_it_escaped(payloads: dict) -> None:
    text = payloads[MATTERMOST]["text"]
    _no_live_markup(text)
    assert "\\[click\\](http://e.vil/x) !\\[pic\\](http://e.vil/i.png)" in text
    assert "\n**python_exception: RuntimeError: \\<!channel\\>" in text


def test_mail_gets_the_job_text_html_escaped_and_the_daemon_markup_rendered(
    payloads: dict,
) -> None:
    mail = payloads["mail"]
    [part] = [p for p in mail.walk() if p.get_content_type() == "text/html"]
    page = part.get_payload(decode=True).decode()
    assert "<strong>python_exception: RuntimeError: &lt;!channel&gt; &lt;!here&gt;" in page
    assert "&lt;img src=x onerror=alert(1)&gt;" in page and "a &amp; b **loud**" in page
    assert "[click](http://e.vil/x) ![pic](http://e.vil/i.png)" in page
    assert "<img" not in page and "<a " not in page and "<em>" not in page
    assert "<li>run <code>job-@here</code>, severity critical</li>" in page  # mail: no mentions
    assert "@here @everyone" in page


def test_a_json_webhook_gets_the_job_text_exact(payloads: dict) -> None:
    payload = payloads[JSON]
    assert ATTACK in payload["message"] and "\\" not in payload["message"]
    assert payload["message"].startswith(f"**python_exception: {ATTACK} (")
    assert payload["title"].startswith(f"[CRITICAL] {RUN}: python_exception: RuntimeError: <!")
