"""`trainsentry check PATH ...`: lint rule files the way a compiler lints source.

The CLI prints what this returns and exits 1 when it is not empty. It checks
each file on its own, so one broken file does not hide another's errors (a
rule repeated across files is not an error: a later file overrides).
"""

from __future__ import annotations

from trainsentry.rules.loader import RuleFileError, expand_paths, load_rules


def check_paths(paths: list[str]) -> list[str]:
    """Every error in every file, each as "file:line:col: message"; [] when all is well."""
    errors: list[str] = []
    try:
        files = expand_paths(paths)
    except RuleFileError as exc:  # a directory with no rule files
        return exc.errors
    for path in files:
        try:
            load_rules([path], alone=True)
        except RuleFileError as exc:
            errors.extend(exc.errors)
    return errors
