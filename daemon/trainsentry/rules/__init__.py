"""Rules: YAML at the boundary, frozen dataclasses inside, a pure engine from points to alerts.

A rule file (checked by `trainsentry check`, loaded by `loader.load_rules`)::

    version: 1
    aliases:                       # extend the shipped table (aliases.SHIPPED)
      loss: [my/objective, "custom/*"]
    rules:
      - name: grad_norm_exponential_growth
        metric: grad_norm          # canonical name(s) or glob(s); or `tag:` for raw tags
        severity: warning          # warning | critical
        family: grad_norm          # a critical silences this family's warnings (same run)
        for: 0                     # 200 steps | 10 points | 90s | 5m ; a bare number is steps
        keep_firing_for: 20 points
        min_step: 0                # points before this step are not evaluated
        labels: {team: nlp}
        message: "{canonical} {evidence} (step {step})"   # the default
        runbook: Lower the learning rate or clip gradients.
        growth:                    # exactly one condition key, see below
          window: 30 points
          min_growth: 10
          threshold: 100
          critical_within: 50 steps

Condition keys, by layer (all amortised O(1) per point):

1. `non_finite: {}`; `threshold: {above, below, resolve_below, resolve_above,
   critical_above, critical_below}` (threshold.py)
2. `plateau: {window, min_improvement, min_delta, method: mean|best, goal: min|max}`
   (windows over 255 steps or points are summed in buckets of at most a 128th of
   them: their edges move a bucket at a time, see window.BucketWindows),
   `rise: {factor, smoothing | window, min_delta, skip}`, `baseline: {learn, skip, rolling,
   z_above, z_below, ratio_above, ratio_below, value_above, value_below}`,
   `pair: {other, ratio_above, gap_above, other_below, other_above, rise_from_best,
   other_fall_since_best, other_smoothing}` (window.py); `throughput: {slowdown,
   source: clock|step_time|rate, learn, skip, recent}`, `no_data: {factor,
   min_silence, max_silence, learn}` (clock.py)
3. `growth: {window, min_growth, min_r2, min_points, min_value, threshold,
   critical_within}`, `spike: {method: sigma|ewma, window, k, min_ratio, fast, slow,
   ratio, warmup, repeat: {count, within}}` (pattern.py)

Message placeholders: run, rule, severity, metric (raw tag), canonical, value,
step, wall_time, evidence, runbook, labels. Scalars follow YAML 1.2: `1e3` is a
number and `on`/`yes` are strings. Later files override earlier rules of the
same name; `enabled: false` drops one; `--rules default` names the shipped pack.

Using the engine (engine.py)::

    engine = Engine(load_rules(paths))          # RuleSet; no I/O inside
    transitions = engine.feed(point)            # per Point, in arrival order
    transitions += engine.tick(time.time())     # live: fires no-data deadlines
    transitions += engine.finish(run_id)        # run ended/deleted: "run finished"
    transitions += engine.reload(new_rules)     # keeps state of unchanged rules
    line = transitions[0].as_dict()             # DESIGN.md's alert JSON line
"""
