"""What a person at a terminal reads: alert lines, the replay timeline, status tables and
the backfill's progress; plain lines off a terminal, rich on one (render.py)."""
