"""Where alerts go: the terminal and a JSON-lines file (terminal.py), any apprise URL
(apprise_sink.py) and Alertmanager (alertmanager.py). The network sinks are driven
by the outbox's delivery workers (alerts/dispatch.py), never by the main loop."""
