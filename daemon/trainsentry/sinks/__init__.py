"""Where alert transitions go: the terminal, a JSON-lines file (later apprise, Alertmanager)."""
