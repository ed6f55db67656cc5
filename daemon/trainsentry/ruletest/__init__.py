"""`trainsentry test`: promtool-style unit tests for rules, on the training step axis.

A test file (YAML) names rule files and gives cases: series per tag in the
compact notation of `trainsentry.rules.notation`, a step cadence, and the
exact transitions (or firing set at given steps) the rules must produce::

    rule_files: [default]              # relative to this file; `default` = the shipped pack
    tests:
      - name: a NaN loss pages at once
        interval: 10                   # steps between slots (start: 0, seconds_per_step: 1)
        series:
          train/loss: "2.0x20 nan"     # 21 values of 2.0, then NaN at step 210
        expect_transitions:            # the exact list; [] means "nothing fires"
          - {step: 210, rule: loss_non_finite, state: firing, severity: critical}
        expect_at:                     # the exact set of firing alerts once step N is in
          - step: 300
            firing: [{rule: loss_non_finite, message: "nan"}]

`spec` reads files (errors at file:line:col), `runner` evaluates and diffs,
`junit` writes the CI report, `command` is what the CLI calls.
"""

from trainsentry.ruletest.runner import CaseResult, run_case, run_file
from trainsentry.ruletest.spec import TestFile, TestFileError, load_test_file

__all__ = ["CaseResult", "TestFile", "TestFileError", "load_test_file", "run_case", "run_file"]
