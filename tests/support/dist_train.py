"""A small real DDP training job (gloo, CPU) for the end-to-end tests to launch with torchrun.

    python -m torch.distributed.run --standalone --nproc_per_node 4 \\
        --log-dir DIR --redirects 3 tests/support/dist_train.py --steps 200 ...

A 2-layer MLP (32 -> 64 -> 8) learns a synthetic 8-class task: the labels are
the argmax of a fixed random linear map of the inputs (the same map on every
rank), each rank drawing its own batches (`--batch-size`, default 256) from its
own generator; the same seed gives the same losses run after run. A step is
about a millisecond of compute and ~10 ms of wall time at 4 ranks on 2 cores
(mostly gloo's all-reduce), so 4 ranks and the daemon fit on 2 cores. Measured
figures and what real failures print: dist_train_findings.md beside this file.

Every rank prints one JSON object per step to stdout, flushed, and nothing
else (torch's and the probe's warnings go to stderr):

    {"step": s, "rank": r, "loss": l, "data_time": d, "step_time": t, "time": u}

- `step`: 0, 1, ..., steps-1;
- `loss`: this rank's local loss on its own batch (not all-reduced);
- `data_time`: seconds from the step's start to its batch being ready
  (includes `--slow-where data` sleeps);
- `step_time`: seconds from the step's start (the batch request) to the end of
  the optimizer step: includes `data_time`, a forward sleep and the wait in
  DDP's gradient all-reduce for the slowest rank; excludes the pad sleep;
- `time`: unix time at the end of the optimizer step.

`--seconds-per-step S` pads each step with a fixed sleep of S seconds after
the optimizer step (the same constant on every rank, not "sleep until a
deadline", which would hide a slow rank's delay): a step then lasts S plus
step_time: N steps take about N * (S + 0.011) s at 4 ranks on 2 cores, plus
7-13 s of start-up before the first step.

Faults (ranks are global ranks; steps count from 0):

- `--slow-rank R --slow-seconds S [--slow-from STEP] [--slow-where data|forward]`:
  rank R sleeps S seconds per step, from STEP on, in its data loading (before
  forward; shows in its data_time) or inside the model's forward (shows in no
  per-rank field: every rank's step_time grows by S, as all wait for it);
- `--corrupt-rank R [--corrupt-from STEP] [--corrupt-how labels|scale]`: rank
  R's batches are garbage from STEP on: random labels (its loss jumps to ~8
  then settles near 3, while the others' stays under 1: 3-46x the median of
  the ranks' losses at every step) or inputs scaled x100 (not rank-local: its
  gradients, averaged in by DDP, make every rank's loss diverge: the others'
  1.7 five steps later, ~1e8 after 75, its own ~100x theirs);
- `--block-rank R --block-at STEP [--block-seconds S]`: rank R sleeps S
  seconds (default 600) before its forward at STEP; the others wait in the
  gradient all-reduce until the process group's timeout (`--pg-timeout`,
  default 1800 s) raises, and torchrun tears the job down.

`--checkpoint FILE --checkpoint-every N`: rank 0 saves the model, the optimizer and
the step every N steps (atomically), and an attempt that finds FILE resumes from
the step after it; with `--crash-after-checkpoint` rank 0 raises right after each
attempt's first save, so under `torchrun --max-restarts` every attempt gets N
steps further and dies (a crash loop that progresses).

`--record-errors` runs main under torch.distributed.elastic's `@record`, so a
rank that raises writes its traceback to the error.json torchrun names in
$TORCHELASTIC_ERROR_FILE (without it torchrun reports `error_file: <N/A>`).

`--probe` attaches trainsentry_probe.watch(model, optimizer, --logdir) on every
rank (by default only rank 0 records; `--probe-all-ranks` makes all record).

A clean run ends with a barrier before destroy_process_group: a rank that
tears gloo down while a peer is still finishing can make the peer's gloo
thread call std::terminate.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

IN, HIDDEN, CLASSES = 32, 64, 8


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--logdir", default=None, help="where the probe writes (with --probe)")
    p.add_argument("--seconds-per-step", type=float, default=0.0, help="pad sleep per step")
    p.add_argument("--batch-size", type=int, default=256, help="per rank")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--pg-timeout", type=float, default=1800.0, help="process-group timeout, s")
    p.add_argument("--slow-rank", type=int, default=None)
    p.add_argument("--slow-seconds", type=float, default=0.0)
    p.add_argument("--slow-from", type=int, default=0)
    p.add_argument("--slow-where", choices=("data", "forward"), default="data")
    p.add_argument("--corrupt-rank", type=int, default=None)
    p.add_argument("--corrupt-from", type=int, default=0)
    p.add_argument("--corrupt-how", choices=("labels", "scale"), default="labels")
    p.add_argument("--block-rank", type=int, default=None)
    p.add_argument("--block-at", type=int, default=None)
    p.add_argument("--block-seconds", type=float, default=600.0)
    p.add_argument("--checkpoint", default=None, help="a file: saved by rank 0, resumed from")
    p.add_argument("--checkpoint-every", type=int, default=0, help="steps between saves")
    p.add_argument(
        "--crash-after-checkpoint",
        action="store_true",
        help="rank 0 raises right after each attempt's first save (a crash loop that progresses)",
    )
    p.add_argument(
        "--stop-file",
        default=None,
        help="end cleanly (exit 0) once this file exists, checked by every rank every 10 steps",
    )
    p.add_argument("--probe", action="store_true", help="attach trainsentry_probe.watch")
    p.add_argument("--probe-all-ranks", action="store_true")
    p.add_argument(
        "--record-errors",
        action="store_true",
        help="wrap main in torch.distributed.elastic's @record: a failed rank writes error.json",
    )
    args = p.parse_args(argv)
    if (args.block_rank is None) != (args.block_at is None):
        p.error("--block-rank and --block-at go together")
    if args.probe and not args.logdir:
        p.error("--probe needs --logdir")
    if (args.checkpoint is None) != (args.checkpoint_every == 0):
        p.error("--checkpoint and --checkpoint-every go together")
    return args


class MLP(nn.Module):
    """Two linear layers; `delay` seconds of sleep inside forward when set."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(IN, HIDDEN)
        self.fc2 = nn.Linear(HIDDEN, CLASSES)
        self.delay = 0.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.delay:
            time.sleep(self.delay)
        return self.fc2(F.relu(self.fc1(x)))


def emit(record: dict[str, float | int]) -> None:
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


def stop_agreed(path: str) -> bool:
    """Whether any rank sees the stop file: every rank takes part, so all stop at one step."""
    seen = torch.tensor([1.0 if os.path.exists(path) else 0.0])
    dist.all_reduce(seen, op=dist.ReduceOp.MAX)
    return bool(seen.item())


def init_process_group(timeout: timedelta) -> None:
    """gloo's process group, its addresses kept apart for each torchrun attempt.

    torchrun's c10d rendezvous gives every attempt of a job the same store (torch 2.13:
    "a new TCPStore for every retry", it says, but the agent's store is kept), and the
    process group's keys carry no attempt: a relaunched rank that reads its peer's
    address before the peer has written it anew gets the address of the attempt before,
    long dead (`Gloo connectFullMesh failed ... Connection refused`, about one relaunch
    in two on a busy 2-core machine). A prefix of the restart count gives each attempt
    keys of its own, as an agent-less launch's fresh store does."""
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    if restart is None:  # not under torchrun: env:// as it comes
        dist.init_process_group("gloo", timeout=timeout)
        return
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
        is_master=rank == 0 and not agent_store, timeout=timeout, multi_tenant=True,
    )  # fmt: skip
    prefixed = dist.PrefixStore(f"attempt_{restart}/", store)
    dist.init_process_group("gloo", store=prefixed, rank=rank, world_size=world, timeout=timeout)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(1)  # torchrun sets OMP_NUM_THREADS=1 only when it is unset
    init_process_group(timedelta(seconds=args.pg_timeout))
    rank = dist.get_rank()

    torch.manual_seed(args.seed)
    teacher = torch.randn(IN, CLASSES)  # the task: the same on every rank
    model = MLP()
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
    probe = None
    if args.probe:
        import trainsentry_probe

        probe = trainsentry_probe.watch(ddp, opt, args.logdir, all_ranks=args.probe_all_ranks)
    gen = torch.Generator().manual_seed(args.seed * 1000 + 100 + rank)
    first = 0
    if args.checkpoint and os.path.exists(args.checkpoint):  # a restarted attempt resumes
        state = torch.load(args.checkpoint, weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        first = int(state["step"]) + 1

    def slow(step: int, where: str) -> bool:
        return rank == args.slow_rank and step >= args.slow_from and args.slow_where == where

    for step in range(first, args.steps):
        start = time.perf_counter()
        if slow(step, "data"):
            time.sleep(args.slow_seconds)
        x = torch.randn(args.batch_size, IN, generator=gen)
        y = (x @ teacher).argmax(1)
        if rank == args.corrupt_rank and step >= args.corrupt_from:
            if args.corrupt_how == "labels":
                y = torch.randint(0, CLASSES, (args.batch_size,), generator=gen)
            else:
                x = x * 100
        data_time = time.perf_counter() - start

        if rank == args.block_rank and step == args.block_at:
            time.sleep(args.block_seconds)
        model.delay = args.slow_seconds if slow(step, "forward") else 0.0
        loss = F.cross_entropy(ddp(x), y)
        loss.backward()  # DDP's gradient all-reduce: waits for every rank
        opt.step()
        opt.zero_grad()
        if probe is not None:
            probe.record(loss=loss)
        end = time.perf_counter()
        emit(
            {
                "step": step,
                "rank": rank,
                "loss": loss.item(),
                "data_time": data_time,
                "step_time": end - start,
                "time": time.time(),
            }
        )
        if args.checkpoint and (step + 1) % args.checkpoint_every == 0:
            if rank == 0:  # whole or not at all: a crash mid-save leaves the last one
                saved = {"model": model.state_dict(), "opt": opt.state_dict(), "step": step}
                torch.save(saved, args.checkpoint + ".tmp")
                os.replace(args.checkpoint + ".tmp", args.checkpoint)
            dist.barrier()
            if args.crash_after_checkpoint and rank == 0:
                raise RuntimeError(f"injected crash after the checkpoint of step {step}")
        if args.seconds_per_step > 0:
            time.sleep(args.seconds_per_step)
        if args.stop_file and step % 10 == 9 and stop_agreed(args.stop_file):
            break

    if probe is not None:
        probe.close()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    if "--record-errors" in sys.argv[1:]:
        from torch.distributed.elastic.multiprocessing.errors import record

        record(main)()
    else:
        main()
