"""Pattern rules on text-log events, and each run's life as its logs tell it.

The numeric engine (engine.py) judges series point by point; a text event is
another kind of input — rare, wordy, and final more often than not — so it
has an engine of its own beside that one, fed by the same tailer and
emitting the same `Transition`s through the same notifier.

A pattern alert is one rule on one run ((run, rule, "log") is its identity).
On the data's own axis, as every rule: the run's step is the last one its
metrics reached (text has no step of its own), its time the event's.

- `for`: the pattern must go on matching for that long (steps, seconds) or
  that many times (`points`) before it fires; a streak ends when no match
  came for as long as `for` itself. Without `for` the first match fires.
- `keep_firing_for`: a firing alert resolves ("no longer logged") once no
  match came for that long, judged as events and points arrive. Without it
  a pattern alert stays firing until its run ends: a crash is not over
  because the job printed one more line.
- `ends_run`: the run's life is now crashed / preempted / cancelled /
  finished, with a cause (`cause`, formatted with the regex's named groups,
  or the matched line). The runtime then ends the run's metric alerts with
  "run crashed: <cause>" rather than letting its silence page as "went
  quiet". Metrics that arrive RESTART_GRACE seconds (on the writer's clock)
  after the end mean the job was restarted: its pattern alerts resolve with
  "run restarted" and it is running again.

The probe's end record and, on the job's host, the process itself end a
run too: the process the probe names or, without the probe, the one found
writing the run's files (`marked`, `writing`, `process_gone`; run_life.py says
how).

Beside the text, the records of every run pass through here one by one
(`stepped`): a job's attempts across restarts (attempts.py) and its checkpoints
against its progress (checkpoints.py) are judged on them, job by job, and a
crash's page says the work since the job's last checkpoint.

Named groups of the regex become labels of the alert. The alert quotes the
event's telling lines (telling.py): the line that matched, the last exception
line of a traceback and the frame above it, with the log's path and line.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from trainsentry.alert import Transition
from trainsentry.jobs import member_of
from trainsentry.jobs.identity import RANK_PREFIX
from trainsentry.point import CHECKPOINT_PREFIX, CHECKPOINT_STEP, ProbeMark, TextEvent
from trainsentry.rules import model as m
from trainsentry.rules.attempts import Attempts, Restart, judged
from trainsentry.rules.checkpoints import (
    CheckpointBook,
    JobCheckpoints,
    Lag,
    lost_message,
    overdue_message,
)
from trainsentry.rules.hang import HangWatch, Report, Verdict, by_rank
from trainsentry.rules.pattern_set import (
    PatternSet,
    Regex,
    compile_regex,
    line_of,
    match_text,
    search,
    text_anchored,
)
from trainsentry.rules.run_life import (
    PROBE,
    WRITER,
    Ending,
    RunLife,
    RunProcess,
    exception_line,
    life_event,
)
from trainsentry.rules.telling import telling
from trainsentry.sources.text_scan import PLAIN, plain_events

LOG_METRIC = "log"  # the metric of a pattern alert: the run's text logs
ATTEMPTS_METRIC = "attempts"  # the metric of a restarts alert: the job's attempts
CHECKPOINTS_METRIC = "checkpoints"  # the metric of a checkpoints alert: the job's saves
RESTART_GRACE = 30.0


_Compiled = tuple[m.Rule, Regex, m.Pattern]
_Applicable = tuple[list[_Compiled], PatternSet]


@dataclass(eq=False, slots=True)
class LogAlert:
    rule: m.Rule
    run: str
    firing: bool = False
    matches: int = 0  # in the current streak
    first: tuple[int, float] = (0, math.nan)  # step, wall of the streak's first match
    last: tuple[int, float] = (0, math.nan)  # and of its latest
    event: TextEvent | None = None  # the latest match
    labels: dict[str, str] = field(default_factory=dict)
    message: str = ""
    telling: tuple[str, ...] = ()
    metric: str = LOG_METRIC  # ATTEMPTS_METRIC for a restarts rule's


@dataclass(eq=False, slots=True)
class _Run:
    life: RunLife = field(default_factory=RunLife)
    alerts: dict[str, LogAlert] = field(default_factory=dict)  # rule name → alert
    processes: dict[str, RunProcess] = field(default_factory=dict)  # file → its writer
    # the (step, wall) its alerts' timers were last judged at, since its last match: a
    # line no rule matched at the same step and time changes nothing they judge
    timed: tuple[int, float] | None = None


class LogEngine:
    """Pattern rules over text events, and the run lives they tell (see the module)."""

    def __init__(self, rules: m.RuleSet | Iterable[m.Rule]) -> None:
        self._runs: dict[str, _Run] = {}
        self.ended: list[tuple[str, RunLife]] = []  # runs that just ended; the runtime takes them
        self._load(rules)
        self.hang = HangWatch(self._hang_rule)  # ranks' collective timeouts held (hang.py)
        self.attempts = Attempts()  # every job's attempts across restarts (attempts.py)
        self.checkpoints = CheckpointBook()  # every job's checkpoints (checkpoints.py)

    def _load(self, rules: m.RuleSet | Iterable[m.Rule]) -> None:
        every = rules.rules if isinstance(rules, m.RuleSet) else tuple(rules)
        self.rules = tuple(r for r in every if isinstance(r.condition, m.Pattern))
        patterns = [(r, r.condition) for r in self.rules if isinstance(r.condition, m.Pattern)]
        # catch-alls last, so they know whether a more telling rule matched the event
        patterns.sort(key=lambda rc: rc[1].fallback)
        self._compiled = [(r, compile_regex(c.regex), c) for r, c in patterns]
        # the rules an event of a (kind, level) can match, filtered once, not per event
        self._applicable: dict[tuple[str, str], _Applicable] = {}
        self._hang_rule = next(
            (r for r in every if isinstance(r.condition, m.CollectiveHang)), None
        )
        self.restart_rules = tuple(r for r in every if isinstance(r.condition, m.Restarts))
        saves = [(r, r.condition) for r in every if isinstance(r.condition, m.Checkpoints)]
        self.overdue_rules = tuple(r for r, c in saves if not c.lost)
        self.lost_rules = tuple(r for r, c in saves if c.lost)
        line_rules = self._for("line", "")[0]
        self._anchored_line_rules = any(text_anchored(c.regex) for *_, c in line_rules)

    def _for(self, kind: str, level: str) -> _Applicable:
        """The rules for events of this kind and level, and their regexes as one set
        (pattern_set.py): one scan of an event says which of them match it."""
        got = self._applicable.get((kind, level))
        if got is None:
            rules = [
                c
                for c in self._compiled
                if (not c[2].levels or level in c[2].levels)
                and (not c[2].events or kind in c[2].events)
            ]
            together = PatternSet([c.regex for *_, c in rules])
            got = self._applicable[(kind, level)] = (rules, together)
        return got

    def reload(self, rules: m.RuleSet | Iterable[m.Rule]) -> list[Transition]:
        """New rules; the alerts of unchanged ones keep firing, the others resolve."""
        self._load(rules)
        keep = {r.name: r for r in self.rules}
        out: list[Transition] = []
        self._decided(self.hang.reload(self._hang_rule), out)
        if self._hang_rule is not None:
            keep[self._hang_rule.name] = self._hang_rule
        keep.update((r.name, r) for r in self.restart_rules)
        keep.update((r.name, r) for r in (*self.overdue_rules, *self.lost_rules))
        for run in self._runs.values():
            for name, alert in list(run.alerts.items()):
                if keep.get(name) != alert.rule:
                    if alert.firing:
                        out.append(self._resolved(alert, run, "rule changed"))
                    del run.alerts[name]
        return out

    def _run(self, run_id: str) -> _Run:
        run = self._runs.get(run_id)
        if run is None:
            run = self._runs[run_id] = _Run()
        return run

    # --- feeding ---

    def feed(self, events: Iterable[TextEvent]) -> list[Transition]:
        """Judge events in order; the transitions they caused."""
        out: list[Transition] = []
        latest = -math.inf
        for event in events:
            latest = max(latest, event.wall_time)
            if event.kind != PLAIN:
                self._judge(event, out)
            elif self._plain_matches(event):  # some line of them matched: judged one by one
                for line in plain_events(event):
                    self._judge(line, out)
            else:  # the progress lines of a read: one scan, and done
                self._unmatched(self._run(event.run), event.wall_time, out)
        if self.hang.waiting:
            self.tick(latest, out)
        return out

    def _plain_matches(self, event: TextEvent) -> bool:
        """Whether a pattern rule may match one of a plain event's lines: its text in one
        scan, the same set of regexes as a line of no level (sources/text_scan.py). A
        regex anchored at the text's ends (`\\A`, `\\z`, `(?-m)`) matches a line where it
        would not match the same line among others: its lines are judged one by one."""
        if self._anchored_line_rules:
            return True
        return bool(self._for("line", "")[1].matching(event.lines[0]))

    def _unmatched(self, run: _Run, wall: float, out: list[Transition]) -> None:
        """An event no rule matched: only the run's alerts' timers may have moved."""
        step = run.life.step
        if run.alerts and run.timed != (step, wall):
            self._timers(run, step, wall, out)
            run.timed = (step, wall)

    def _judge(self, event: TextEvent, out: list[Transition]) -> None:
        run = self._run(event.run)
        step, wall = run.life.step, event.wall_time
        rules, together = self._for(event.kind, event.level)
        text = match_text(event)
        hits = together.matching(text)
        if not hits:  # a progress line: one scan, and done
            self._unmatched(run, wall, out)
            return
        matched = False
        for hit in hits:
            rule, regex, cond = rules[hit]
            if cond.fallback and matched:
                continue
            match = search(regex, event, text)
            if match is None:
                continue  # the set saw it across a cut line's cut, where it is not
            matched = matched or not cond.fallback
            if cond.collective_timeout and self._held(rule, event, step, wall):
                continue
            self._matched(run, rule, event, match, step, wall, out)
        self._timers(run, step, wall, out)

    # --- a collective hang, named by the rank the others waited for (hang.py) ---

    def _held(self, rule: m.Rule, event: TextEvent, step: int, wall: float) -> bool:
        group = member_of(event.run).group
        report = Report(event.run, rule, event, step, wall)
        return self.hang.hold(report, self._ranks_of().get(group, set()))

    def _ranks_of(self, *, alive: bool = False) -> dict[str, set[str]]:
        """The ranks of each group whose metrics or text were seen; `alive`: only those
        whose life has not ended by a line of their own (a rank that crashed with an error
        of its own meanwhile, a peer's exit it read as one, did not block the others: it
        said something; one whose process was seen gone, killed by torchrun once the
        others failed, said nothing)."""
        out: dict[str, set[str]] = {}
        for name, run in self._runs.items():
            member = member_of(name)
            life = run.life
            if member.ranked and not (alive and life.ended and not life.by_process):
                out.setdefault(member.group, set()).add(name)
        return out

    def tick(self, now: float, out: list[Transition] | None = None) -> list[Transition]:
        """Decide the held timeouts whose grace is over by `now` (the daemon's clock live;
        inf at the end of a replay)."""
        out = [] if out is None else out
        if self.hang.waiting:
            self._decided(self.hang.due(now, self._ranks_of(alive=True)), out)
        return out

    def _decided(self, verdicts: list[Verdict], out: list[Transition]) -> None:
        """Page the rank the others waited for, then the waiting ranks' own timeouts."""
        regexes = {rule: regex for rule, regex, _ in self._compiled}
        for verdict in verdicts:
            matched = [
                (report, found)
                for report in verdict.reports
                if (regex := regexes.get(report.rule)) is not None
                and (found := search(regex, report.event, match_text(report.event))) is not None
            ]  # a reload may have changed or dropped the rule since it held the report
            if not matched:
                continue
            first, first_match = matched[0]
            rule = self._hang_rule
            if verdict.blocked and rule is not None:
                blocked = verdict.blocked[0]
                run = self._run(blocked)
                alert = run.alerts.get(rule.name)
                if alert is None:
                    alert = run.alerts[rule.name] = LogAlert(rule, blocked)
                run.timed = None
                if not alert.firing:
                    alert.matches += 1
                    alert.first = alert.last = (first.step, first.wall)
                    alert.event = first.event
                    alert.telling = telling(first.event, line_of(first_match))
                    alert.labels = {
                        **dict(rule.labels),
                        "blocked": ",".join(_rank_name(r) for r in verdict.blocked),
                        "waited": ",".join(_rank_name(r.run) for r in verdict.reports),
                    }
                    alert.message = self._hang_message(verdict, alert.telling[0])
                    alert.firing = True
                    out.append(self._transition(alert, "firing", first.step, first.wall, None))
            for report, found in matched:
                run = self._run(report.run)
                self._matched(run, report.rule, report.event, found, report.step, report.wall, out)

    def _hang_message(self, verdict: Verdict, timeout_line: str) -> str:
        first = verdict.reports[0]
        waited = [r.run for r in verdict.reports]
        by_step: dict[int, list[str]] = {}
        for run in (*verdict.blocked, *waited):
            by_step.setdefault(self._run(run).life.step, []).append(run)
        if len(by_step) == 1:
            steps = f"every rank last logged step {next(iter(by_step))}"
        else:
            steps = "last logged: " + "; ".join(
                f"{_ranks_said(runs)} step {step}" for step, runs in sorted(by_step.items())
            )
        where = f"{first.event.path}:{first.event.line}"
        line = RANK_PREFIX.sub("", timeout_line, count=1)
        return (
            f"{_ranks_said(verdict.blocked)} of {member_of(first.run).job} did not join a"
            f" collective: {_ranks_said(waited)} timed out waiting for it ({line}, {where});"
            f" {steps}"
        )

    def saw(self, run_id: str, step: int, wall: float) -> list[Transition]:
        """The run's metrics reached `step` at `wall`: the axis pattern alerts are judged on."""
        run = self._run(run_id)
        life = run.life
        life.step = step
        out: list[Transition] = []
        if life.ended and wall > life.ended_wall + RESTART_GRACE:
            self._restart(run, step, wall, out)
            return out
        life.wall = wall
        self._timers(run, step, wall, out)
        return out

    def _restart(self, run: _Run, step: int, wall: float, out: list[Transition]) -> None:
        """The run that ended is written again: its pattern alerts resolve, it runs. What
        fired on its job's records (its restart, its checkpoints) stands: the restart is
        what a `job_restarted` says."""
        for name, alert in list(run.alerts.items()):
            if alert.metric != LOG_METRIC:
                continue
            if alert.firing:
                out.append(self._resolved(alert, run, "run restarted"))
            del run.alerts[name]
        run.life = RunLife(step=step, wall=wall)

    def stepped(
        self, run_id: str, records: Iterable[tuple[int, float, tuple[str, ...], object]]
    ) -> list[Transition]:
        """A run's records (Rows: step, stamp, tags, values), each: the attempts of its job
        (attempts.py, a record's shape its tags) and its checkpoints (checkpoints.py).
        Each record, not a read's last: a read of a backlog may hold the end of one attempt
        and the beginning of the next, the step going back between them. A checkpoint's
        row (its tags `checkpoint/...`, sources/checkpoints.py) is a save, not a step the
        job logged."""
        out: list[Transition] = []
        saw = self.attempts.saw
        book = self.checkpoints
        for step, wall, tags, _ in records:
            if tags and tags[0].startswith(CHECKPOINT_PREFIX):
                if CHECKPOINT_STEP in tags:
                    self._saved(run_id, step, wall, out)
                continue
            restart = saw(run_id, step, wall, tags)
            if restart is not None:
                self._restarted(self._run(run_id), restart, out)
            if book.active:
                self._logged(run_id, step, wall, out)
        return out

    # --- a job's checkpoints (checkpoints.py) ---

    def _saved(self, run_id: str, step: int, wall: float, out: list[Transition]) -> None:
        """A complete checkpoint: what fired on its job's saves is over."""
        job = self.checkpoints.saved(run_id, step, wall)
        if job is None:
            return
        run = self._runs.get(run_id)
        if run is None:
            return
        for rule in (*self.overdue_rules, *self.lost_rules):
            alert = run.alerts.get(rule.name)
            if alert is not None and alert.firing:
                alert.firing = False
                out.append(self._transition(alert, "resolved", step, wall, "recovered"))

    def _logged(self, run_id: str, step: int, wall: float, out: list[Transition]) -> None:
        """A record of a job that checkpoints: is its last checkpoint overdue?"""
        job = self.checkpoints.job_of(run_id)
        if job is None:
            return
        job.note(step, wall)
        for rule in self.overdue_rules:
            spec: m.Checkpoints = rule.condition  # type: ignore[assignment]
            lag = job.lag(step, wall, spec.learn)
            if lag is None or not lag.overdue(spec):
                continue
            run = self._run(job.run)
            alert = run.alerts.get(rule.name)
            if alert is not None and alert.firing:
                continue
            if any(a.firing for r in self.lost_rules if (a := run.alerts.get(r.name))):
                continue  # the critical said it
            self._fire_checkpoints(run, rule, job, lag, overdue_message(job, lag), out)

    def _lost(self, run_id: str, how: str, out: list[Transition]) -> None:
        """One of a job's runs crashed or hung: page the work lost if its checkpoints were
        overdue at the job's last record, and end the overdue warning (the page says more)."""
        if not self.lost_rules:
            return
        job = self.checkpoints.related(run_id)
        if job is None or job.logged is None:
            return
        run = self._run(job.run)
        for rule in self.lost_rules:
            spec: m.Checkpoints = rule.condition  # type: ignore[assignment]
            lag = job.lag(*job.logged, spec.learn)
            alert = run.alerts.get(rule.name)
            if lag is None or not lag.overdue(spec) or (alert is not None and alert.firing):
                continue
            self._fire_checkpoints(run, rule, job, lag, lost_message(run_id, how, job, lag), out)
            for warned in self.overdue_rules:
                alert = run.alerts.get(warned.name)
                if alert is not None and alert.firing and warned.group == rule.group:
                    alert.firing = False
                    out.append(
                        self._transition(
                            alert, "resolved", lag.step, lag.wall, f"inhibited by {rule.name}"
                        )
                    )

    def _saves_moot(self, run_id: str, wall: float, out: list[Transition]) -> None:
        """A run of the job finished: its overdue checkpoints no longer put work at risk."""
        job = self.checkpoints.related(run_id) if self.checkpoints.active else None
        run = self._runs.get(job.run) if job is not None else None
        if job is None or run is None:
            return
        for rule in self.overdue_rules:
            alert = run.alerts.get(rule.name)
            if alert is not None and alert.firing:
                alert.firing = False
                step = job.logged[0] if job.logged else alert.last[0]
                out.append(self._transition(alert, "resolved", step, wall, "run finished"))

    def _fire_checkpoints(
        self,
        run: _Run,
        rule: m.Rule,
        job: JobCheckpoints,
        lag: Lag,
        said: str,
        out: list[Transition],
    ) -> None:
        # its value: the steps since the last checkpoint
        label = ("checkpoint_step", str(lag.saved_step))
        at = (lag.step, lag.wall)
        self._fire_job_alert(
            run, rule, job.run, CHECKPOINTS_METRIC, lag.steps, label, at, said, out
        )

    def _fire_job_alert(
        self,
        run: _Run,
        rule: m.Rule,
        run_id: str,
        metric: str,
        value: int,
        label: tuple[str, str],
        at: tuple[int, float],
        said: str,
        out: list[Transition],
    ) -> None:
        """Fire a rule judged on a job's records, not on a matched line (its checkpoints,
        its attempts): its value, one label of its own, its words, at `at`."""
        run.timed = None
        alert = run.alerts.get(rule.name)
        if alert is None:
            alert = run.alerts[rule.name] = LogAlert(rule, run_id, metric=metric)
        alert.first = alert.last = at
        alert.matches = value
        alert.labels = {**dict(rule.labels), label[0]: label[1]}
        alert.message = said
        alert.firing = True
        out.append(self._transition(alert, "firing", at[0], at[1], None))

    def _since_checkpoint(self, run_id: str, wall: float) -> str:
        """A crash's page's words on the work since the job's last checkpoint; "" where the
        job has none known."""
        job = self.checkpoints.related(run_id) if self.checkpoints.active else None
        if job is None or job.logged is None:
            return ""
        step, logged = job.logged
        said = job.since(step, max(logged, wall) if math.isfinite(wall) else logged)
        return f"; {said}" if said else ""

    def _restarted(self, run: _Run, restart: Restart, out: list[Transition]) -> None:
        """A job's new attempt began with this run's point: the restarts rules judge it."""
        for rule in self.restart_rules:
            spec: m.Restarts = rule.condition  # type: ignore[assignment]
            fired, said = judged(spec, restart)
            alert = run.alerts.get(rule.name)
            if not fired or (alert is not None and alert.firing):
                continue
            if (spec.storm or spec.no_progress) and self._firing_in_job(restart.job, rule.name):
                continue  # a storm is the job's: told once, on the attempt that began it
            label = ("attempt", str(len(restart.recent) - 1))
            at = (restart.step, restart.wall)
            self._fire_job_alert(
                run, rule, restart.run, ATTEMPTS_METRIC, restart.restarts, label, at, said, out
            )

    def _attempt_ended(
        self,
        run_id: str,
        cause: str,
        wall: float,
        out: list[Transition] | None,
        failed: bool,
        waited: bool = False,
    ) -> None:
        """How a run's attempt ended; one that failed before any point is a restart judged
        now."""
        restart = self.attempts.ended(run_id, cause, wall, failed=failed, waited=waited)
        if restart is not None and out is not None:
            self._restarted(self._run(run_id), restart, out)

    def _firing_in_job(self, job: str, rule: str) -> bool:
        for name, other in self._runs.items():
            alert = other.alerts.get(rule)
            if alert is not None and alert.firing and member_of(name).job == job:
                return True
        return False

    def _matched(
        self,
        run: _Run,
        rule: m.Rule,
        event: TextEvent,
        match: Any,  # re2's match: its named groups, where it is
        step: int,
        wall: float,
        out: list[Transition],
    ) -> None:
        run.timed = None
        alert = run.alerts.get(rule.name)
        if alert is None:
            alert = run.alerts[rule.name] = LogAlert(rule, event.run)
        if not alert.matches:
            alert.first = (step, wall)
        alert.matches += 1
        alert.last = (step, wall)
        alert.event = event
        groups = {k: v for k, v in match.groupdict().items() if v is not None}
        alert.labels = {**dict(rule.labels), **groups}
        alert.telling = telling(event, line_of(match))
        alert.message = self._render(alert, rule, event, match.group(0), step, groups)
        cond: m.Pattern = rule.condition  # type: ignore[assignment]
        if "node" in groups:  # the node the run's attempt runs on (attempts.py)
            self.attempts.ran_on(event.run, groups["node"])
        if cond.new_attempt:  # every time it is said, firing or not (attempts.py)
            self.attempts.boundary(event.run, _cause(cond.cause, groups, alert.telling[0]), wall)
        if alert.firing or not _reached(rule.for_, alert.first, alert.last, alert.matches):
            return
        alert.firing = True
        life = run.life
        if cond.ends_run not in (None, "finished") and not life.ended:
            alert.message += self._since_checkpoint(event.run, wall)  # what the end cost
        out.append(self._transition(alert, "firing", step, wall, None))
        if cond.ends_run is not None and (
            not life.ended or (life.by_fallback and not cond.fallback)
        ):
            first = not life.ended
            life.state, life.ended_wall, life.by_fallback = cond.ends_run, wall, cond.fallback
            life.cause = _cause(cond.cause, groups, alert.telling[0])
            failed = cond.ends_run != "finished"
            self._attempt_ended(event.run, life.cause, wall, out, failed, cond.collective_timeout)
            if first:
                self.ended.append((event.run, life))
                if cond.ends_run == "crashed":
                    self._lost(event.run, "crashed", out)

    def _timers(self, run: _Run, step: int, wall: float, out: list[Transition]) -> None:
        """Streaks that ended, firing alerts no longer logged (keep_firing_for)."""
        for alert in run.alerts.values():
            if not alert.matches:
                continue
            rule = alert.rule
            if alert.firing:
                span = rule.keep_firing_for
                if span is not None and _gap(span, alert.last, step, wall):
                    quiet = "no restart" if alert.metric == ATTEMPTS_METRIC else "no longer logged"
                    out.append(self._resolved(alert, run, f"{quiet} for {span}"))
                    alert.firing, alert.matches = False, 0
            elif rule.for_ is not None and _gap(rule.for_, alert.last, step, wall, strictly=True):
                alert.matches = 0

    # --- the probe's records and the process (run_life.py) ---

    def marked(self, marks: Iterable[ProbeMark]) -> list[Transition]:
        """The probe's meta records name the processes that write a run; an end record
        ends the run (finished once every process named closed cleanly), an exception's
        end record is a line of the run's life for the pattern rules to page."""
        out: list[Transition] = []
        for mark in marks:
            run = self._run(mark.run)
            if mark.kind == "meta":
                # the probe says more than a writer found in /proc: its end record
                run.processes = {k: p for k, p in run.processes.items() if p.by == PROBE}
                run.processes[mark.path] = RunProcess.of(mark)
                if mark.host:
                    self.attempts.starts_on(mark.run, mark.host)
                continue
            process = run.processes.get(mark.path)
            if process is not None:
                process.ended = mark.exit or "clean"
            if mark.exit == "exception":
                text = exception_line(mark)
                event = life_event(mark.run, mark.path, mark.line, mark.wall_time, text)
                out += self._ended_by(run, event, "crashed", mark.error or "an exception")
            elif all(p.ended for p in run.processes.values()):
                self._end_life(mark.run, run.life, "finished", "", mark.wall_time, out)
        return out

    def writing(self, run_id: str, process: RunProcess) -> list[Transition]:
        """A process found holding one of the run's files open for writing (a WRITER,
        runtime/writers.py): watched from now on as the probe's process would be. A run
        its last writer's end ended is written by another process: restarted."""
        run = self._run(run_id)
        out: list[Transition] = []
        if any(p.by == PROBE for p in run.processes.values()):
            return out
        life = run.life
        if life.ended:
            if not life.by_writer:
                return out  # its logs said how it ended; RESTART_GRACE tells a restart
            self._restart(run, life.step, life.wall, out)
        run.processes[process.path] = process
        return out

    def unwatched(self, runs: Iterable[str]) -> list[str]:
        """Of `runs`, those that no probe names and no live writer writes, still running
        or ended by their writer's end: the runs whose writer is to be looked for."""
        out = []
        for name in runs:
            run = self._runs.get(name)
            if run is None:
                out.append(name)
                continue
            watched = any(p.by == PROBE or not p.ended for p in run.processes.values())
            if not watched and (not run.life.ended or run.life.by_writer):
                out.append(name)
        return out

    def processes(self, host: str, namespace: str) -> list[tuple[str, RunProcess]]:
        """The processes of live runs a daemon on `host`, in pid namespace `namespace`,
        can see die."""
        return [
            (name, process)
            for name, run in self._runs.items()
            if not run.life.ended
            for process in run.processes.values()
            if process.checkable(host, namespace)
        ]

    def watching(self, run_id: str, host: str, namespace: str) -> RunProcess | None:
        """The process watched for a live run (the probe's first), for `status`."""
        run = self._runs.get(run_id)
        if run is None or run.life.ended:
            return None
        live = [p for p in run.processes.values() if p.checkable(host, namespace)]
        return min(live, key=lambda p: p.by != PROBE, default=None)

    def process_of(self, run_id: str, path: str) -> RunProcess | None:
        run = self._runs.get(run_id)
        return run.processes.get(path) if run is not None else None

    def process_gone(
        self, run_id: str, path: str, wall: float, ending: Ending | None = None
    ) -> list[Transition]:
        """The process that writes `path` is gone. The probe's wrote no end record: it
        crashed. A writer's ended as `ending` says (runtime/writers.py): crashed or
        exited with a line of the run's life to judge, finished with none, or nothing
        said (state "": the watch ends and the run goes on as its logs tell)."""
        run = self._runs.get(run_id)
        process = run.processes.get(path) if run is not None else None
        if run is None or process is None or process.ended or run.life.ended:
            return []
        process.ended = "gone"
        if ending is None or process.by != WRITER:
            ending = Ending("crashed", process.gone_line())
        out: list[Transition] = []
        if ending.line:
            event = life_event(run_id, path, process.line, wall, ending.line)
            out = self._ended_by(run, event, ending.state, ending.line)
        elif ending.state:
            self._end_life(run_id, run.life, ending.state, "", wall)
        run.life.by_writer = process.by == WRITER and run.life.ended
        run.life.by_process = run.life.ended
        return out

    def _ended_by(self, run: _Run, event: TextEvent, state: str, cause: str) -> list[Transition]:
        """Judge the event; a run no rule ended (the rule dropped) ends as it says anyway."""
        out = self.feed([event])
        self._end_life(event.run, run.life, state, cause, event.wall_time, out)
        return out

    def _end_life(
        self,
        run_id: str,
        life: RunLife,
        state: str,
        cause: str,
        wall: float,
        out: list[Transition] | None = None,
    ) -> None:
        """End a life not ended yet, and tell the runtime (`ended`)."""
        if life.ended:
            return
        life.state, life.cause, life.ended_wall = state, cause, wall
        self._attempt_ended(run_id, cause or state, wall, out, state != "finished")
        self.ended.append((run_id, life))
        if out is not None and state == "crashed":
            self._lost(run_id, "crashed", out)
        elif out is not None and state == "finished":
            self._saves_moot(run_id, wall, out)

    # --- ending ---

    def finish(self, run_id: str, reason: str = "run finished") -> list[Transition]:
        """Resolve what fires on a run and forget it; a run that ended says how."""
        run = self._runs.pop(run_id, None)
        self.attempts.forget(run_id)
        self.checkpoints.forget(run_id)
        if run is None:
            return []
        if run.life.ended and reason in ("run finished", "run deleted"):
            reason = run.life.reason
        return [self._resolved(a, run, reason) for a in run.alerts.values() if a.firing]

    def reported(self, run_id: str, state: str, cause: str, wall: float) -> list[Transition]:
        """A source says outright that the run ended (MLflow's run status, W&B's exit
        record): its life ends as an `ends_run` rule would end it, and the runtime ends
        its alerts (`ended`). What its logs said already stands: a crash with its
        traceback's words says more than "MLflow run status FAILED"."""
        life = self._run(run_id).life
        out: list[Transition] = []
        when = wall if math.isfinite(wall) else life.wall
        self._end_life(run_id, life, state, cause, when, out)
        return out

    def stalled(self, run_id: str, stalled: bool) -> list[Transition]:
        """The run's data stopped (a no-data rule fired) or resumed; stopped while its job's
        checkpoints were overdue, the work since the last one is paged (checkpoints.py)."""
        run = self._runs.get(run_id)
        out: list[Transition] = []
        if run is not None and not run.life.ended:
            was = run.life.state
            run.life.state = "stalled" if stalled else "running"
            if stalled and was != "stalled":
                self._lost(run_id, "hung", out)
        return out

    def life(self, run_id: str) -> RunLife | None:
        run = self._runs.get(run_id)
        return run.life if run is not None else None

    def lives(self) -> dict[str, RunLife]:
        return {name: run.life for name, run in self._runs.items()}

    def firing(self) -> list[Transition]:
        return [
            self._transition(a, "firing", a.last[0], a.last[1], None)
            for run in self._runs.values()
            for a in run.alerts.values()
            if a.firing
        ]

    # --- what is shown ---

    def _render(
        self,
        alert: LogAlert,
        rule: m.Rule,
        event: TextEvent,
        matched: str,
        step: int,
        groups: dict[str, str],
    ) -> str:
        # line 0: no line of the file said it (a writer's process gone, runtime/writers.py)
        where = f"{event.path}:{event.line}" if event.line else event.path
        quoted = "\n".join(f"  {line}" for line in alert.telling[1:])
        default = f"{alert.telling[0]} ({where})" + (f"\n{quoted}" if quoted else "")
        if rule.message is None:
            return default
        fields: dict[str, Any] = {
            "run": alert.run, "rule": rule.name, "severity": rule.severity,
            "metric": LOG_METRIC, "canonical": LOG_METRIC, "value": float(alert.matches),
            "step": step, "wall_time": event.wall_time, "evidence": default,
            "runbook": rule.runbook or "", "labels": alert.labels, "match": matched,
            "path": event.path, "line": event.line,
        }  # fmt: skip
        try:
            return rule.message.format_map(fields) + (f"\n{quoted}" if quoted else "")
        except (ValueError, KeyError, IndexError, AttributeError, TypeError) as exc:
            return f"{default} (message template of {rule.name} failed: {exc})"

    def _resolved(self, alert: LogAlert, run: _Run, reason: str) -> Transition:
        alert.firing = False
        return self._transition(alert, "resolved", run.life.step, alert.last[1], reason)

    def _transition(
        self, alert: LogAlert, state: str, step: int, wall: float, reason: str | None
    ) -> Transition:
        rule, event = alert.rule, alert.event
        message = (
            alert.message
            if state == "firing"
            else f"resolved ({reason}): {alert.metric} at step {step}"
        )
        log = None
        if event is not None:
            log = {"path": event.path, "line": event.line, "lines": list(alert.telling)}
        return Transition(
            run=alert.run,
            rule=rule.name,
            severity=rule.severity,
            state="firing" if state == "firing" else "resolved",
            step=step,
            wall_time=wall,
            metric=alert.metric,
            value=float(alert.matches),
            message=message,
            canonical=alert.metric,
            family=rule.group,
            reason=reason,
            runbook=rule.runbook,
            labels=dict(alert.labels),
            log=log,
        )


def _cause(template: str | None, groups: dict[str, str], line: str) -> str:
    if template is None:  # the line as a cause: a rank's prefix says nothing its run does not
        return RANK_PREFIX.sub("", line, count=1)
    try:
        return template.format_map(groups)
    except (ValueError, KeyError, IndexError):
        return template


def _reached(
    span: m.Span | None, first: tuple[int, float], last: tuple[int, float], n: int
) -> bool:
    return span is None or span.reached(last[0] - first[0], _elapsed(last[1], first[1]), n)


def _gap(
    span: m.Span, last: tuple[int, float], step: int, wall: float, *, strictly: bool = False
) -> bool:
    """No match for as long as `span` since `last` (longer, `strictly`; points: never)."""
    gap: float
    if span.unit == "steps":
        gap = step - last[0]
    elif span.unit == "seconds":
        gap = _elapsed(wall, last[1])
    else:
        return False
    return gap > span.amount if strictly else gap >= span.amount


def _elapsed(later: float, earlier: float) -> float:
    return later - earlier if math.isfinite(later) and math.isfinite(earlier) else 0.0


def _rank_name(run: str) -> str:
    rank = member_of(run).rank
    return f"rank {rank}" if rank is not None else run


def _ranks_said(runs: Iterable[str]) -> str:
    """`rank 2`, `ranks 0, 1 and 3`, as a person would say them."""
    ranks = [member_of(r).rank for r in sorted(runs, key=by_rank)]
    if len(ranks) == 1 or None in ranks:
        return ", ".join(_rank_name(r) for r in sorted(runs, key=by_rank))
    head = ", ".join(str(r) for r in ranks[:-1])
    return f"ranks {head} and {ranks[-1]}"
