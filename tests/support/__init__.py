"""What the tests share: processes to drive, local endpoints, fake clocks and synthetic data.

A package, imported as `support.…`, so that a test's imports say where a
helper lives; the scripts here that run as their own processes (a training
job, a log writer) are run by path and import nothing from it.
"""
