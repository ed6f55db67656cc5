"""The in-process probe: heavy training statistics computed inside the job.

Not built yet (issue 5). It will write `trainsentry-probe.rank<R>.jsonl` in
the run's log directory, which the daemon reads with its JSONL source; the
daemon never imports this package and this package never imports the daemon.
"""

RECORD_FORMAT_VERSION = 1
