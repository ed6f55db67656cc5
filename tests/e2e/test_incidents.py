"""One page per run per incident, through the real daemon to a real local endpoint.

A run that goes bad trips several rules, one after another; a person is paged
once, and the later alerts reach them together as the incident's update. The
terminal says the same: a later firing line says which incident it joins.
"""

from __future__ import annotations

from pathlib import Path

from support.daemon_process import DaemonProcess
from support.notify_endpoints import HttpReceiver


def test_a_runs_later_criticals_join_its_page_and_the_terminal_says_so(tmp_path: Path) -> None:
    run = tmp_path / "logs" / "exp"
    run.mkdir(parents=True)
    log = run / "metrics.jsonl"
    log.write_text("".join(f'{{"step": {s}, "loss": 1.0, "grad_norm": 1.0}}\n' for s in range(5)))
    receiver = HttpReceiver()
    daemon = DaemonProcess(
        str(tmp_path / "logs"), "--state-dir", str(tmp_path / "state"), "--http", "off",
        "--history", "all", "--notify", f"json://{receiver.url}/hook",
        "--group-interval", "3s", merge_stderr=True,
    )  # fmt: skip
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
