"""`python -m trainsentry` with apprise's Slack, Discord and Telegram pointed at a local receiver.

Those three services send only to their own hosts (hooks.slack.com,
discord.com, api.telegram.org): apprise has no URL option to send them
elsewhere. The end-to-end tests need the real daemon and the real plugins to
build the real payloads, so this runs the daemon exactly as `python -m
trainsentry ARGS` does, with only each plugin's base address replaced by
`SERVICES_AT` (`http://127.0.0.1:PORT`): the path, the JSON, the headers are
the plugins' own.
"""

from __future__ import annotations

import os
import runpy

from apprise.plugins.discord import NotifyDiscord
from apprise.plugins.slack import NotifySlack
from apprise.plugins.telegram import NotifyTelegram

ENV = "SERVICES_AT"


def point_at(base: str) -> None:
    NotifySlack.webhook_url = f"{base}/services"
    NotifyDiscord.notify_url = f"{base}/api/webhooks"
    NotifyTelegram.notify_url = f"{base}/bot"


if __name__ == "__main__":
    point_at(os.environ[ENV])
    runpy.run_module("trainsentry", run_name="__main__", alter_sys=True)
