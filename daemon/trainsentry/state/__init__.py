"""The state dir the daemon writes: the SQLite database (offsets, outbox, sent log) and
how alerting goes on when that disk is full."""
