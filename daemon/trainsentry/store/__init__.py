"""Points kept per run × tag in bounded memory: the evidence alerts carry.

`series.py` is one run × tag (a recent window at full resolution, older points
in buckets); `runs.py` is every run's series and the rows waiting to be filed.
"""

from trainsentry.store.runs import Store
from trainsentry.store.series import Bucket, Series

__all__ = ["Bucket", "Series", "Store"]
