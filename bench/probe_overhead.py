"""What the probe costs per training step, against the same loop without it.

    python bench/probe_overhead.py [--device cpu|cuda] [--size small|gpt2] [--rounds 5]

Variants, measured in one process and interleaved round by round (so drift in
clock speed or a noisy neighbour hits all of them alike), each timed as the
median over rounds of the mean step time:

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
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

import trainsentry_probe


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument("--rounds", type=int, default=5)
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
    times: dict[str, list[float]] = {name: [] for name in variants}
    cpu: dict[str, list[float]] = {name: [] for name in variants}
    model, opt, step = make(args.size, device)
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(10):  # warm-up: allocator, kernels, lazy optimizer state
            step()
        for round_ in range(args.rounds):
            for name, options in variants.items():
                probe = None
                hook = step.hook  # type: ignore[attr-defined]
                if options is not None:
                    # numbered as if one run went on across rounds (1 + steps so far), so
                    # each tier falls on its cadence, not on every round's step 0
                    probe = trainsentry_probe.watch(
                        model,
                        opt,
                        f"{tmp}/{name}/{round_}",
                        gpu_sample_seconds=0,
                        start_step=1 + round_ * args.steps,
                        **options,
                    )
                if name == "naive":
                    hook["after_backward"] = naive_norms(model)
                sync()
                start, start_cpu = time.perf_counter(), time.thread_time()
                for _ in range(args.steps):
                    step()
                sync()
                times[name].append((time.perf_counter() - start) / args.steps)
                cpu[name].append((time.thread_time() - start_cpu) / args.steps)
                hook.pop("after_backward", None)
                if probe is not None:
                    probe.close()

    base = statistics.median(times["plain"])
    base_cpu = statistics.median(cpu["plain"])
    where = f"{device.type}" + (
        f" ({torch.cuda.get_device_name(device)})"
        if device.type == "cuda"
        else f", {torch.get_num_threads()} threads"
    )
    print(f"probe overhead: {args.size} model on {where}; torch {torch.__version__}")
    if device.type != "cuda":
        print("no GPU in this run: CPU figures only; the GPU figure is for a session with one")
    print("median over rounds. CPU = CPU time of the training thread: on a shared machine")
    print("it is steadier than wall time; it leaves out the probe's writer thread, which")
    print("runs beside the loop (on another core where there is one)")
    print(f"{'variant':<12} {'ms/step':>9} {'ratio':>8} {'CPU ms':>9} {'CPU ratio':>10}")
    for name in variants:
        t, c = statistics.median(times[name]), statistics.median(cpu[name])
        print(f"{name:<12} {t * 1e3:9.3f} {t / base:8.4f} {c * 1e3:9.3f} {c / base_cpu:10.4f}")


if __name__ == "__main__":
    main()
