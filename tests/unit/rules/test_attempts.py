"""A job's attempts across restarts (rules/attempts.py), as the text engine judges them."""

from __future__ import annotations

import pickle

from trainsentry.alert import Transition
from trainsentry.point import Row, TextEvent
from trainsentry.rules.attempts import Attempts, young_on_nodes
from trainsentry.rules.loader import load_rules
from trainsentry.rules.log_rules import LogEngine

T0 = 1_800_000_000.0


LOSS = ("loss",)
REQUEUE = (
    "slurmstepd: error: *** JOB 42 ON n7 CANCELLED AT 2026-01-01T00:00:00 DUE TO JOB REQUEUE ***"
)


def fed(engine: LogEngine, run: str, steps: range, start: float) -> list[Transition]:
    return engine.stepped(run, (Row(s, start + (s - steps.start), LOSS, (1.0,)) for s in steps))


def fired(out: list[Transition]) -> list[tuple[str, str]]:
    return [(t.rule, t.run) for t in out if t.state == "firing"]


def test_a_log_whose_step_goes_back_and_goes_on_is_a_restart_of_its_job() -> None:
    """A plain script resumed from its checkpoint, appending to the same log: its ranks
    rewind together, one restart."""
    engine = LogEngine(load_rules())
    out: list[Transition] = []
    for rank in (0, 1):
        out += fed(engine, f"exp/rank{rank}", range(0, 500), T0)
    for rank in (0, 1):
        out += fed(engine, f"exp/rank{rank}", range(400, 450), T0 + 600)
    [(rule, run)] = fired(out)
    assert (rule, run) == ("job_restarted", "exp/rank0")
    message = next(t.message for t in out if t.rule == "job_restarted")
    assert "exp restarted: attempt 2 resumed at step 400; the attempt before got to step 499" in (
        message
    )
    assert "99 steps and" in message


def test_the_other_node_of_one_launch_is_no_restart() -> None:
    """Two torchrun agents (two nodes) of rendezvous id llm write side by side."""
    engine = LogEngine(load_rules())
    out: list[Transition] = []
    for step in range(100):
        for agent in ("aaaaaaaa", "bbbbbbbb"):
            out += engine.stepped(f"llm_{agent}/attempt_0/0", (Row(step, T0 + step, LOSS, (1.0,)),))
    assert fired(out) == []


def test_attempts_torchrun_numbered_but_never_logged_count_towards_a_storm() -> None:
    """attempt_2 died in its rendezvous, logging no step: attempt_3 is the third restart."""
    engine = LogEngine(load_rules())
    out: list[Transition] = []
    for n, first in ((0, 0), (1, 30), (3, 60)):
        out += fed(engine, f"j_abcdefgh/attempt_{n}/0", range(first, first + 30), T0 + 100 * n)
    assert fired(out) == [
        ("job_restarted", "j_abcdefgh/attempt_1/0"),
        ("job_restarted", "j_abcdefgh/attempt_3/0"),
        ("restart_storm", "j_abcdefgh/attempt_3/0"),
    ]


# the lines a rank of torchrun's relaunch wrote when gloo's rendezvous failed (torch
# 2.13, 2 CPU ranks under --max-restarts on a busy machine), paths shortened
GLOO_FAILED = (
    "Traceback (most recent call last):",
    '  File "dist_train.py", line 165, in main',
    '    dist.init_process_group("gloo", timeout=timedelta(seconds=args.pg_timeout))',
    '  File "torch/distributed/distributed_c10d.py", line 2169, in _new_process_group_helper',
    "    backend_class = ProcessGroupGloo(",
    "RuntimeError: Gloo connectFullMesh failed with [/__w/pytorch/pytorch/third_party/gloo/"
    "gloo/transport/tcp/pair.h:311] Connect timeout [none]",
)


def test_relaunches_that_all_die_before_their_first_step_are_a_storm_when_they_end() -> None:
    """A crash loop whose last relaunches all die in the rendezvous logs no step again: each
    is a restart once its ranks' tracebacks say it ended, the third a storm."""
    engine = LogEngine(load_rules())
    out: list[Transition] = []
    for n, first in ((0, 0), (1, 30)):
        out += fed(engine, f"j_abcdefgh/attempt_{n}/0", range(first, first + 30), T0 + 100 * n)
    for n in (2, 3):
        for rank in (0, 1):
            run = f"j_abcdefgh/attempt_{n}/{rank}"
            crash = TextEvent("stderr.log", 1, T0 + 100 * n, GLOO_FAILED, "traceback", run=run)
            out += engine.feed([crash])
    restarts = [(rule, run) for rule, run in fired(out) if rule != "python_exception"]
    assert restarts == [
        ("job_restarted", "j_abcdefgh/attempt_1/0"),
        ("job_restarted", "j_abcdefgh/attempt_2/0"),
        ("job_restarted", "j_abcdefgh/attempt_3/0"),
        ("restart_storm", "j_abcdefgh/attempt_3/0"),
    ]
    [storm] = [t for t in out if t.rule == "restart_storm"]
    assert "attempt 4 ended before its first step: RuntimeError: Gloo connectFullMesh" in (
        storm.message
    )
    assert "3 restarts in 30 min" in storm.message
    assert engine.attempts.of("j_abcdefgh/attempt_1/0") == (4, 2)


def test_an_attempts_end_read_before_its_points_is_one_restart_that_logged() -> None:
    """One read may give a rank's traceback before the points its other file holds."""
    engine = LogEngine(load_rules())
    out = fed(engine, "j_abcdefgh/attempt_0/0", range(0, 30), T0)
    run = "j_abcdefgh/attempt_1/1"
    crash = TextEvent("stderr.log", 1, T0 + 130, GLOO_FAILED, "traceback", run=run)
    out += engine.feed([crash])
    out += fed(engine, "j_abcdefgh/attempt_1/0", range(30, 60), T0 + 100)
    assert [r for r, _ in fired(out) if r != "python_exception"] == ["job_restarted"]
    out += fed(engine, "j_abcdefgh/attempt_2/0", range(60, 90), T0 + 200)
    message = [t.message for t in out if t.rule == "job_restarted"][-1]
    assert "attempt 3 resumed at step 60" in message


# rank 0 raised; rank 1's allreduce then ended on the connection rank 0's exit closed
# (torch 2.13, gloo, 2 CPU ranks), paths shortened
RAISED = (
    "Traceback (most recent call last):",
    '  File "dist_train.py", line 240, in main',
    '    raise RuntimeError(f"injected crash after the checkpoint of step {step}")',
    "RuntimeError: injected crash after the checkpoint of step 29",
)
PEER_CLOSED = (
    "Traceback (most recent call last):",
    '  File "dist_train.py", line 221, in main',
    "    dist.all_reduce(loss)",
    "RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection "
    "closed by peer [127.0.0.1]:4001",
)


def test_an_attempt_ended_by_the_rank_that_raised_not_by_the_peer_it_left_waiting() -> None:
    """Whichever rank's log is read first, the restart says rank 0's error, not the
    connection rank 1's collective lost when rank 0 exited."""
    for order in ((1, 0), (0, 1)):
        engine = LogEngine(load_rules())
        out: list[Transition] = []
        for rank in (0, 1):
            out += fed(engine, f"j_abcdefgh/attempt_0/{rank}", range(0, 30), T0)
        for rank in order:
            lines = RAISED if rank == 0 else PEER_CLOSED
            run = f"j_abcdefgh/attempt_0/{rank}"
            out += engine.feed([TextEvent("stderr.log", 1, T0 + 31, lines, "traceback", run=run)])
        out += engine.tick(T0 + 60)  # the held collective timeout fires
        out += fed(engine, "j_abcdefgh/attempt_1/0", range(30, 60), T0 + 100)
        [message] = [t.message for t in out if t.rule == "job_restarted"]
        assert "got to step 29 and ended: RuntimeError: injected crash after the" in message
        assert "gloo_collective_timeout" in {t.rule for t in out}, order


def test_the_attempts_are_saved_with_the_alert_state() -> None:
    engine = LogEngine(load_rules())
    fed(engine, "j_abcdefgh/attempt_0/0", range(0, 30), T0)
    fed(engine, "j_abcdefgh/attempt_1/0", range(30, 60), T0 + 100)
    restored: LogEngine = pickle.loads(pickle.dumps(engine))
    out = fed(restored, "j_abcdefgh/attempt_2/0", range(60, 90), T0 + 200)
    assert ("restart_storm", "j_abcdefgh/attempt_2/0") not in fired(out)  # 2 restarts
    out = fed(restored, "j_abcdefgh/attempt_3/0", range(90, 120), T0 + 300)
    assert ("restart_storm", "j_abcdefgh/attempt_3/0") in fired(out)


def test_a_storm_is_told_once_for_its_job() -> None:
    """Restarts 3, 4 and 5 all fall within the half hour: one storm, on the third."""
    engine = LogEngine(load_rules())
    out: list[Transition] = []
    for n in range(6):
        run = f"j_abcdefgh/attempt_{n}/0"
        out += fed(engine, run, range(30 * n, 30 * n + 30), T0 + 60 * n)
    storms = [run for rule, run in fired(out) if rule == "restart_storm"]
    assert storms == ["j_abcdefgh/attempt_3/0"]


def test_a_runs_series_read_one_file_after_another_are_no_restart() -> None:
    """MLflow's file store keeps a file per metric: a run's loss is read to its end, then
    its grad_norm from step 0. Only a series of the run going back is a resume."""
    engine = LogEngine(load_rules())
    out = engine.stepped("store/exp1/run-1", (Row(s, T0 + s, LOSS, (1.0,)) for s in range(500)))
    out += engine.stepped(
        "store/exp1/run-1", (Row(s, T0 + s, ("grad_norm",), (1.0,)) for s in range(500))
    )
    assert fired(out) == []
    out = engine.stepped(
        "store/exp1/run-1", (Row(s, T0 + 900 + s, LOSS, (1.0,)) for s in range(400, 450))
    )
    assert fired(out) == [("job_restarted", "store/exp1/run-1")]


def test_status_counts_a_jobs_attempts_and_the_one_each_run_is_in() -> None:
    """torchrun's attempt_0, attempt_2 (attempt_1 died in its rendezvous, unseen) of one job."""
    engine = LogEngine(load_rules())
    fed(engine, "j_abcdefgh/attempt_0/0", range(0, 30), T0)
    assert engine.attempts.of("j_abcdefgh/attempt_0/0") == (1, 1)
    fed(engine, "j_abcdefgh/attempt_2/0", range(20, 40), T0 + 300)
    assert engine.attempts.of("j_abcdefgh/attempt_2/0") == (3, 3)
    assert engine.attempts.of("j_abcdefgh/attempt_0/0") == (3, 1)
    assert engine.attempts.of("never/logged") is None


def test_a_requeue_line_makes_the_next_record_another_attempt_past_the_last_words() -> None:
    """Slurm requeued the job right after its save at step 200: the attempt after resumes
    at the step it had logged last, which no rewind shows; the records the attempt wrote
    in Slurm's KillWait after the line are its own."""
    engine = LogEngine(load_rules())
    out = fed(engine, "slurm", range(0, 201), T0)
    line = TextEvent("slurm-42.out", 1, T0 + 200, (REQUEUE,), run="slurm")
    out += engine.feed([line])
    out += fed(engine, "slurm", range(200, 203), T0 + 205)  # its SIGTERM handler's records
    preempted = REQUEUE.replace("42", "43").replace("JOB REQUEUE", "PREEMPTION")
    out += engine.feed([TextEvent("slurm-42.out", 2, T0 + 206, (preempted,), run="slurm")])
    assert [rule for rule, _ in fired(out)] == ["slurm_requeued", "slurm_preempted"]
    assert engine.attempts.of("slurm") == (1, 1)
    out += fed(engine, "slurm", range(202, 260), T0 + 400)
    assert engine.attempts.of("slurm") == (2, 2)
    [restart] = [t for t in out if t.rule == "job_restarted"]
    assert "attempt 2 resumed at step 202" in restart.message
    assert "ended: preempted by Slurm (job 43)" in restart.message  # its latest word


def test_a_node_is_named_once_two_attempts_on_it_died_young_and_not_for_long_ones() -> None:
    """Slurm's lines name each attempt's node: two attempts on gpu-3 of 8 min (young) name
    it; the same job's attempts of an hour on gpu-1 do not name gpu-1."""
    engine = LogEngine(load_rules())
    out: list[Transition] = []
    at = T0
    for n, (node, minutes) in enumerate([("gpu-1", 60), ("gpu-1", 60), ("gpu-3", 8), ("gpu-3", 8)]):
        steps = range(100 * n, 100 * n + minutes + 1)
        out += engine.stepped(
            "slurm", (Row(s, at + 60 * (s - steps.start), LOSS, (1.0,)) for s in steps)
        )
        at += 60 * minutes
        line = REQUEUE.replace("ON n7", f"ON {node}")
        out += engine.feed([TextEvent("slurm-42.out", n + 1, at, (line,), run="slurm")])
        at += 120
    out += fed(engine, "slurm", range(400, 450), at)
    messages = [
        t.message
        for t in out
        if t.state == "firing" and t.rule in ("job_restarted", "restart_storm")
    ]
    assert messages and not any("gpu-1" in m for m in messages)
    [storm] = [t.message for t in out if t.rule == "restart_storm" and t.state == "firing"]
    assert "attempts on node gpu-3 keep dying young: 2 of its 2 ended within 10 min" in storm


def test_the_host_a_probe_names_is_the_node_of_the_attempts_its_run_begins() -> None:
    """torchrun's attempt runs: the probe's meta record comes before each one's first step."""
    attempts = Attempts()
    for n in range(3):
        run = f"j_abcdefgh/attempt_{n}/0"
        attempts.starts_on(run, "gpu-9")
        for step in range(50 * n, 50 * n + 20):  # 20 s each: young
            attempts.saw(run, step, T0 + 100 * n + step - 50 * n)
    restart = attempts.saw("j_abcdefgh/attempt_3/0", 150, T0 + 400)
    assert restart is not None and [a.node for a in restart.recent] == ["gpu-9"] * 3 + [""]
    assert young_on_nodes(restart.recent[:-1]).startswith(
        "; attempts on node gpu-9 keep dying young: 3 of its 3"
    )
