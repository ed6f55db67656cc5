"""What the probe costs per training step, against the same loop without it.

    python bench/probe_overhead.py [--device cpu|cuda] [--size small|small-2k|gpt2] [--rounds 9]

Variants, measured in one process and interleaved round by round, in an order
rotated each round (so drift in clock speed or a noisy neighbour hits all of
them alike), each compared with the plain loop of the same round; the spread
of those per-round ratios is printed with their median:

- plain:       the loop alone;
- default:     watch() at its default cadences (per-layer every 100 steps,
               activations every 1000; per-step scalars every step);
- layers/step: per-layer statistics (norms, update ratios) on every step;
- everything:  every tier on every step (activations and attention too);
- naive:       what tutorials do, `p.grad.norm().item()` per parameter per step
               (one synchronising read per parameter).

Targets (issue 5): default ≤ 1 %, layers/step ≤ 5 %, and several times cheaper
than naive. On the CPU a device read is free, so naive looks cheaper than it
is on a GPU, where every `.item()` waits for the queue to drain; the GPU
figures (--device cuda --size gpt2) are the ones that decide.

On a shared machine the ratios wander by several percent either way, more
than the probe's cost at default cadences; so a last pass also clocks the
time spent inside the probe's hooks (the training thread's share of its cost,
noise-free to a microsecond) and in the writer thread's rendering.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import trainsentry_probe
from trainsentry_probe.activations import ActivationSampler
from trainsentry_probe.probe import Probe
from trainsentry_probe.writer import RecordWriter


class GPTish(nn.Module):
    """A causal transformer: token + position embeddings, pre-norm encoder layers."""

    def __init__(self, vocab: int, width: int, layers: int, heads: int, context: int) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, width)
        self.positions = nn.Embedding(context, width)
        layer = nn.TransformerEncoderLayer(
            width,
            heads,
            4 * width,
            dropout=0.1,
            batch_first=True,
            norm_first=True,
            activation="gelu",
        )
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(width, vocab)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(context))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        n = tokens.shape[1]
        x = self.tokens(tokens) + self.positions(torch.arange(n, device=tokens.device))
        return self.head(self.blocks(x, mask=self.mask[:n, :n], is_causal=True))


SIZES = {  # vocab, width, layers, heads, context, batch
    "small": (512, 128, 2, 4, 32, 8),
    # the same model at 2,048 tokens a step (a fine-tune's batch is 4-8k, a pre-training
    # step's 0.5-4M): the per-step gradient read costs the same against 8x the compute
    "small-2k": (512, 128, 2, 4, 64, 32),
    "gpt2": (50257, 768, 12, 12, 512, 8),
}


def make(
    size: str, device: torch.device
) -> tuple[GPTish, torch.optim.Optimizer, Callable[[], None]]:
    vocab, width, layers, heads, context, batch = SIZES[size]
    torch.manual_seed(0)
    model = GPTish(vocab, width, layers, heads, context).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    data = torch.randint(0, vocab, (batch, context + 1), device=device)
    hook: dict[str, Callable[[], None]] = {"after_step": lambda: None}

    def step() -> None:
        logits = model(data[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, vocab), data[:, 1:].reshape(-1))
        loss.backward()
        hook["after_backward"]() if "after_backward" in hook else None
        opt.step()
        opt.zero_grad(set_to_none=True)
        hook["after_step"]()

    step.hook = hook  # type: ignore[attr-defined]
    return model, opt, step


def naive_norms(model: nn.Module) -> Callable[[], None]:
    def read() -> None:
        for p in model.parameters():
            if p.grad is not None:
                p.grad.norm().item()

    return read


# the probe's hook bodies: everything it runs on the training thread
HOOKS = (
    "_on_forward_pre",
    "_on_forward",
    "_on_backward_start",
    "_requeue",
    "_on_backward_end",
    "_on_step_pre",
    "_on_step_post",
    "_record",
)


class HookClock:
    """Seconds spent inside the probe's hooks (training thread) and in the writer's
    rendering (its own thread), by wrapping the class attributes before watch()."""

    def __init__(self) -> None:
        self.hooks = 0.0
        self.writer = 0.0
        self._saved: list[tuple[type, str, Any]] = []

    def _wrap(self, cls: type, name: str, field: str) -> None:
        original = getattr(cls, name)
        self._saved.append((cls, name, original))

        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                setattr(self, field, getattr(self, field) + time.perf_counter() - start)

        setattr(cls, name, timed)

    def __enter__(self) -> HookClock:
        for name in HOOKS:
            self._wrap(Probe, name, "hooks")
        for name in ("_measure", "embedding_stats"):  # the activation hooks' bodies
            self._wrap(ActivationSampler, name, "hooks")
        self._wrap(RecordWriter, "_lines", "writer")
        return self

    def __exit__(self, *exc: object) -> None:
        for cls, name, original in reversed(self._saved):
            setattr(cls, name, original)


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):7.4f} [{min(values):.4f}-{max(values):.4f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--threads", type=int, default=1, help="torch threads on the CPU")
    parser.add_argument("--steps", type=int, default=100, help="steps per variant per round")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cpu":  # all compute on the timed thread, so its CPU time is the step's
        torch.set_num_threads(args.threads)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    variants: dict[str, dict[str, object] | None] = {
        "plain": None,
        "default": {},
        "layers/step": {"layer_every": 1},
        "everything": {"layer_every": 1, "sample_every": 1},
        "naive": None,
    }
    names = list(variants)
    times: dict[str, list[float]] = {name: [] for name in variants}
    cpu: dict[str, list[float]] = {name: [] for name in variants}
    clocks: dict[str, tuple[float, float]] = {}
    model, opt, step = make(args.size, device)
    hook = step.hook  # type: ignore[attr-defined]

    def timed_run(name: str, logdir: str, first_step: int) -> tuple[float, float]:
        options = variants[name]
        probe = None
        if options is not None:
            # numbered as if one run went on across rounds, so each tier falls on its
            # cadence (once per 100 steps at the default), not on every round's step 0
            probe = trainsentry_probe.watch(
                model, opt, logdir, gpu_sample_seconds=0, start_step=first_step, **options
            )
        if name == "naive":
            hook["after_backward"] = naive_norms(model)
        sync()
        start, start_cpu = time.perf_counter(), time.thread_time()
        for _ in range(args.steps):
            step()
        sync()
        wall, used = time.perf_counter() - start, time.thread_time() - start_cpu
        hook.pop("after_backward", None)
        if probe is not None:
            probe.close()
        return wall / args.steps, used / args.steps

    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(10):  # warm-up: allocator, kernels, lazy optimizer state
            step()
        for round_ in range(args.rounds):
            shift = round_ % len(names)  # each variant takes each position in turn
            for name in names[shift:] + names[:shift]:
                wall, used = timed_run(name, f"{tmp}/{name}/{round_}", 1 + round_ * args.steps)
                times[name].append(wall)
                cpu[name].append(used)
        for name in ("default", "layers/step", "everything"):
            with HookClock() as clock:
                timed_run(name, f"{tmp}/{name}/clocked", 1)
            clocks[name] = (clock.hooks / args.steps, clock.writer / args.steps)

    where = f"{device.type}" + (
        f" ({torch.cuda.get_device_name(device)})"
        if device.type == "cuda"
        else f", {torch.get_num_threads()} threads"
    )
    print(f"probe overhead: {args.size} model on {where}; torch {torch.__version__}")
    if device.type != "cuda":
        print("no GPU in this run: CPU figures only; the GPU figure is for a session with one")
    print(f"{args.rounds} rounds x {args.steps} steps, variants rotated each round; ratio =")
    print("variant / plain of the same round, median [min-max] over rounds. CPU = CPU time")
    print("of the training thread (steadier on a shared machine; leaves out the writer thread)")
    print(f"{'variant':<12} {'ms/step':>8} {'wall ratio':>24} {'CPU ratio':>24}")
    for name in names:
        wall = [t / p for t, p in zip(times[name], times["plain"], strict=True)]
        used = [c / p for c, p in zip(cpu[name], cpu["plain"], strict=True)]
        ms = statistics.median(times[name]) * 1e3
        print(f"{name:<12} {ms:8.3f} {spread(wall):>24} {spread(used):>24}")
    base = statistics.median(times["plain"])
    print("time inside the probe per step (one clocked pass; the clocks add ~1 us a call):")
    print(f"{'variant':<12} {'hooks us':>9} {'of a step':>10} {'writer us':>10}")
    for name, (hooks, writer) in clocks.items():
        print(f"{name:<12} {hooks * 1e6:9.1f} {hooks / base:10.2%} {writer * 1e6:10.1f}")
    if device.type == "cuda":
        print("(on a GPU the hooks' host time overlaps the queued kernels; the wall ratio decides)")


if __name__ == "__main__":
    main()
