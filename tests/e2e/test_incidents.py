"""One page per run per incident, through the real daemon to a real local endpoint.

A run that goes bad trips several rules, one after another; a person is paged
once, and the later alerts reach them together as the incident's update. The
terminal says the same: a later firing line says which incident it joins.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from support.daemon_process import DaemonProcess
from support.notify_endpoints import HttpReceiver, Request


def _daemon(tmp_path: Path, receiver: HttpReceiver) -> DaemonProcess:
    return DaemonProcess(
        str(tmp_path / "logs"), "--state-dir", str(tmp_path / "state"), "--http", "off",
        "--history", "all", "--notify", f"json://{receiver.url}/hook",
        "--group-interval", "3s", merge_stderr=True,
    )  # fmt: skip


def test_a_runs_later_criticals_join_its_page_and_the_terminal_says_so(tmp_path: Path) -> None:
    run = tmp_path / "logs" / "exp"
    run.mkdir(parents=True)
    log = run / "metrics.jsonl"
    log.write_text("".join(f'{{"step": {s}, "loss": 1.0, "grad_norm": 1.0}}\n' for s in range(5)))
    receiver = HttpReceiver()
    daemon = _daemon(tmp_path, receiver)
    try:
        with log.open("a") as f:
            f.write('{"step": 5, "loss": NaN, "grad_norm": 1.0}\n')
        assert receiver.wait_for(lambda reqs: len(reqs) >= 1, timeout=60)
        with log.open("a") as f:  # the validation loss too, read in a cycle of its own
            f.write('{"step": 6, "val_loss": NaN}\n')
        daemon.wait_for_text("joins the incident opened by loss_non_finite at step 5")
        with log.open("a") as f:  # then the gradients, 20 steps of them
            f.writelines(
                f'{{"step": {s}, "loss": NaN, "grad_norm": Infinity}}\n' for s in range(7, 30)
            )
        daemon.wait_until(lambda: sum("joins the incident" in x for x in daemon.lines) >= 2)
        assert receiver.wait_for(lambda reqs: len(reqs) >= 2, timeout=60)
    finally:
        daemon.stop()
        receiver.close()
    page, update = (r.json() for r in receiver.requests[:2])
    assert page["title"].startswith("[CRITICAL] exp: loss_non_finite")
    assert "2 alerts" in update["title"] and "grad_norm_non_finite" in update["title"]
    assert len(receiver.requests) == 2  # the two later ones came as one update, not two pages


def test_a_warning_the_recovering_point_fires_is_the_incidents_update(tmp_path: Path) -> None:
    """Logged every 50 steps: a loss ×10 for 5 points pages loss_level_shift; the point
    back at its old level resolves the critical "recovered" and shows loss_level_raised
    (its 1000-step mean still ×3 the lowest, held under the critical until then). The
    person paged for it hears that as the incident's update, with the resolve, not as a
    notification of a new incident."""
    run = tmp_path / "logs" / "exp"
    run.mkdir(parents=True)
    log = run / "metrics.jsonl"
    losses = [2.0, 1.5, 1.0, 0.5, 0.3, 0.2] + [0.1] * 31
    log.write_text("".join(f'{{"step": {50 * i}, "loss": {v}}}\n' for i, v in enumerate(losses)))
    receiver = HttpReceiver()
    daemon = DaemonProcess(
        str(tmp_path / "logs"), "--state-dir", str(tmp_path / "state"), "--http", "off",
        "--history", "all", "--notify", f"json://{receiver.url}/hook",
        "--group-interval", "3s", "--group-wait", "1s", merge_stderr=True,
    )  # fmt: skip
    try:
        with log.open("a") as f:  # ×10 for 5 points: the page on the third (150 steps)
            f.writelines(f'{{"step": {50 * i}, "loss": 1.0}}\n' for i in range(37, 42))
        assert receiver.wait_for(lambda reqs: len(reqs) >= 1, timeout=60)
        with log.open("a") as f:
            f.writelines(f'{{"step": {50 * i}, "loss": 0.1}}\n' for i in range(42, 67))
        daemon.wait_for_text("joins the incident opened by loss_level_shift at step 1950")
        # the held resolve leaves a group interval on, with the update or after it
        told = "loss_level_shift resolved (recovered)"
        assert receiver.wait_for(lambda reqs: any(told in _text(r) for r in reqs), timeout=60)
    finally:
        daemon.stop()
        receiver.close()
    page, *later = (r.json() for r in receiver.requests)
    assert page["title"].startswith("[CRITICAL] exp: loss_level_shift")
    update = "update to the incident of loss_level_shift at step 1950 of exp"
    for message in later:  # no notification of its own: an update, or the held resolve
        assert update in message["title"] or message["title"].startswith(
            "[RESOLVED] exp: loss_level_shift"
        ), message["title"]
    assert any(update in m["title"] and "loss_level_raised" in m["message"] for m in later)


def _text(request: Request) -> str:
    body = request.json()
    return f"{body['title']}\n{body['message']}"


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # keras/numpy 2 noise
def test_keras_with_both_loggers_is_one_job_one_page(tmp_path: Path) -> None:
    """A Keras fit logging twice: CSVLogger in the job's directory and TensorBoard
    below it (Keras' own TensorBoard callback needs TensorFlow, so torch's
    SummaryWriter at each epoch's end, as a torch-backend user writes it). Two runs,
    one job: a NaN trips loss_non_finite in both, and a person is paged once; the
    terminal says the second joins the first."""
    os.environ.setdefault("KERAS_BACKEND", "torch")
    keras = pytest.importorskip("keras")
    import numpy as np
    from torch.utils.tensorboard import SummaryWriter

    job = tmp_path / "logs" / "job"
    job.mkdir(parents=True)
    x = np.ones((16, 3), "float32")
    x[0, 0] = np.nan  # a corrupt sample upstream: every epoch's loss is NaN
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    board = SummaryWriter(str(job / "tb"))
    callbacks = [
        keras.callbacks.LambdaCallback(
            on_epoch_end=lambda epoch, logs: board.add_scalar("epoch_loss", logs["loss"], epoch)
        ),
        keras.callbacks.CSVLogger(str(job / "training.log")),
    ]
    model.fit(x, np.zeros((16, 1), "float32"), epochs=3, verbose=0, callbacks=callbacks)
    board.close()
    receiver = HttpReceiver()
    daemon = _daemon(tmp_path, receiver)
    try:
        daemon.wait_for_text("joins the incident opened by loss_non_finite")
        assert receiver.wait_for(lambda reqs: len(reqs) >= 2, timeout=60)  # page, then update
    finally:
        daemon.stop()
        receiver.close()
    page, update = (r.json() for r in receiver.requests[:2])
    first, second = sorted(
        ["job", "job/tb"], key=lambda r: not page["title"].startswith(f"[CRITICAL] {r}:")
    )
    assert page["title"] == f"[CRITICAL] {first}: loss_non_finite: loss at step 0 is nan"
    assert update["title"].startswith(
        f"[CRITICAL] {second}: update to the incident of loss_non_finite at step 0 of {first}: "
    )
    assert len(receiver.requests) == 2
