"""trainsentry: watches what training jobs already log and alerts before a run is lost."""

__version__ = "0.1.0"
