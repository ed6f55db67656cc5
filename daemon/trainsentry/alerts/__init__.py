"""From alert transitions to people and systems, losing none and repeating none.

notifier.py   the front the main loop calls: routes, incidents, actions, enqueue
route.py      a receiver and which alerts it wants
outbox.py     the persisted queue in the state database (idempotency, sent log)
grouping.py   per-run batching, repeat interval, rate limit, the firing book
dispatch.py   one delivery worker per receiver: retries, backoff, jitter
message.py    title and markdown body; plot.py the evidence PNG
incident.py   the bundle saved on every firing
"""
