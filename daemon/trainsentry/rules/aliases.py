"""What common writers call a metric, mapped onto the names rules are written against.

Users write `metric: grad_norm` once and it works whether the run was logged by
the HF Trainer (`train/grad_norm`), PyTorch Lightning (`grad_norm`), a tutorial
loop (`Gradient/Norm`) or the probe (`probe/grad_norm`). Resolution happens
once per new tag and is cached: a run with a million points has a few dozen tags.

Patterns use `*` for "any text, including `/`"; a canonical name may carry a
`*` too, which receives what the pattern's `*` matched — that is how per-layer
series stay addressable (`probe/grad_norm/fc1.weight` → `grad_norm/fc1.weight`).
A tag that matches no listed tag exactly nor any pattern is compared once more
with case and word separators ignored (`LearningRate`, `Learning_Rate` and
`learning-rate` are `learning_rate`), so an unseen spelling of a known name
still resolves; anything else is its own canonical name.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

# canonical name → the tags writers use for it. Order matters only among
# patterns with `*`: exact tags always win, then patterns in table order.
SHIPPED: dict[str, tuple[str, ...]] = {
    # per-step (or per-logging-step) training loss
    "loss": (
        "loss",
        "train/loss",  # HF Trainer
        "train_loss",  # Lightning self.log("train_loss")
        "train_loss_step",  # Lightning on_step=True, on_epoch=True
        "train_loss_epoch",  # ... and its epoch mean, as Keras' epoch_loss below
        "train/loss_step",  # Lightning self.log("train/loss", on_step, on_epoch) to W&B/MLflow
        "train/loss_epoch",
        "Loss/train",  # PyTorch tutorial
        "train/batch_loss",  # Keras, update_freq="batch"
        "batch_loss",
        "train/epoch_loss",  # Keras TensorBoard callback, train/ split
        "epoch_loss",  # Keras, a run without split directories
        "training_loss",
        "train/train_loss",
        "probe/loss",
    ),
    "val_loss": (
        "val_loss",
        "eval/loss",  # HF Trainer
        "eval_loss",  # HF Trainer's log_history / metrics dicts
        "valid_loss",  # fastai
        "validation_loss",
        "Loss/val",  # tutorial
        "Loss/valid",
        "Loss/validation",
        "validation/epoch_loss",  # Keras, validation/ split
        "val/loss",
        "valid/loss",
        "validation/loss",
        "test/loss",  # TF2's tf.summary tutorial: a test/ writer beside train/
        "Loss/test",
        "val_loss_epoch",  # Lightning on_step=True, on_epoch=True in validation_step
        "val/loss_epoch",  # ... logged as "val/loss", as W&B users name it
        "probe/val_loss",
    ),
    "grad_norm": (
        "grad_norm",
        "train/grad_norm",  # HF Trainer
        "Gradient/Norm",  # tutorial
        "gradient_norm",
        "grad_norm_total",
        "grad_2.0_norm_total",  # Lightning's grad_norm(module, norm_type=2) utility
        "train/batch_grad_norm",  # Keras, a custom metric logged per batch
        "batch_grad_norm",
        "train/gradient_norm",
        "probe/grad_norm",
    ),
    # per-parameter norms: Lightning's grad_norm utility logs `grad_2.0_norm/<param>`
    "grad_norm/*": ("probe/grad_norm/*", "grad_2.0_norm/*"),
    "lr": (
        "lr",
        "learning_rate",
        "LearningRate",  # tensorboardX tutorial style
        "train/learning_rate",  # HF Trainer
        "train/lr",
        "epoch_learning_rate",  # Keras
        "train/epoch_learning_rate",
        "train/batch_learning_rate",  # Keras, update_freq="batch"
        "batch_learning_rate",
        "optimizer/lr",
        "probe/lr",
        "lr-*",  # Lightning LearningRateMonitor: lr-Adam, lr-AdamW, lr-Adam/pg1, ...
    ),
    # seconds per training step (not per sample, not milliseconds)
    "step_time": (
        "step_time",
        "train/step_time",
        "Time/step",  # tensorboardX tutorial style
        "time/step",
        "train/batch_step_time",  # Keras, update_freq="batch"
        "batch_step_time",
        "iteration_time",
        "iteration-time",  # Megatron-LM's TensorBoard tag
        "train/iteration_time",
        "perf/step_time",
        "time_per_step",
        "probe/step_time",
    ),
    # samples (or tokens) per second: the inverse of step time, per unit of work
    "throughput": (
        "throughput",
        "samples_per_second",
        "samples_per_sec",
        "train/samples_per_second",
        "perf/samples_per_second",
        "probe/samples_per_second",
    ),
    # the probe's statistics that ordinary logs lack (probe/trainsentry_probe/FORMAT.md);
    # per-layer series end in the layer's module name: probe/grad_norm/encoder.layers.0.fc1
    # seconds a step waited for its batch: with forward_time, a rank's own time before its
    # first collective, what a straggler shows in (rules/ranks.py)
    "data_wait": (
        "probe/data_wait",
        "data_wait",
        "data_time",  # the PyTorch ImageNet example's and timm's name
        "train/data_time",
        "time/data",
        "perf/data_time",
        "dataloader_time",
        "data_loading_time",
    ),
    "forward_time": ("probe/forward_time", "forward_time", "fwd_time", "time/forward"),
    "nonfinite_grads": ("probe/nonfinite_grads",),  # parameters with a NaN/inf gradient
    "grad_concentration": ("probe/grad_concentration",),  # max / median of layer norms
    "param_norm/*": ("probe/param_norm/*",),
    "update_ratio": ("probe/update_ratio",),
    "update_ratio/*": ("probe/update_ratio/*",),
    "dead_fraction/*": ("probe/dead_fraction/*",),
    "zero_fraction/*": ("probe/zero_fraction/*",),
    "saturation/*": ("probe/saturation/*",),
    "act_mean/*": ("probe/act_mean/*",),
    "act_std/*": ("probe/act_std/*",),
    "attn_entropy/*": ("probe/attn_entropy/*",),
    "embed_norm_mean/*": ("probe/embed_norm_mean/*",),
    "embed_norm_spread/*": ("probe/embed_norm_spread/*",),
    "sample_loss/*": ("probe/sample_loss/*",),  # p50, p95, p95_over_p50, top5_share
    "gpu_mem": ("probe/gpu_mem",),  # bytes allocated by torch, after the optimizer step
    "gpu_mem_reserved": ("probe/gpu_mem_reserved",),
    "gpu_mem_peak": ("probe/gpu_mem_peak",),
    "gpu_util": ("probe/gpu_util",),  # NVML, percent
    "gpu_mem_used": ("probe/gpu_mem_used",),  # NVML, bytes used on the device by all processes
}


AliasTable = Mapping[str, Iterable[str]] | Iterable[tuple[str, Iterable[str]]]


def spelling(tag: str) -> str:
    """A tag with case and word separators dropped: `LearningRate`, `learning-rate`,
    `Learning_Rate` and `learning_rate` are one spelling. Path separators stay:
    `train/loss` and `trainloss` are different names."""
    return tag.lower().replace("_", "").replace("-", "").replace(" ", "")


class Glob:
    """A `*` glob (`*` stands for any text, `/` included), matched in linear time.

    Not a regex: `^a(.*)b(.*)c$` backtracks, and a pattern with several stars
    (`*grad*norm*x`) against one long tag took seconds (a run's tags are
    written by anyone). The segments between stars are placed right to left,
    each as far right as it fits, with C-level rfind: a match exists exactly
    when this placement succeeds, and it gives the first `*` the longest text
    it can take, as the regex's greedy group did.
    """

    __slots__ = ("_head", "_middle", "_parts", "_tail")

    def __init__(self, pattern: str) -> None:
        self._parts = parts = pattern.split("*")
        self._head, self._tail = parts[0], parts[-1]
        self._middle = tuple(reversed(parts[1:-1]))

    def star(self, text: str) -> str | None:
        """What the first `*` stands for in `text` ("" without one); None: no match."""
        head, tail = self._head, self._tail
        if len(self._parts) == 1:
            return "" if text == head else None
        lo, hi = len(head), len(text) - len(tail)
        if hi < lo or not text.startswith(head) or not text.endswith(tail):
            return None
        first = hi
        for segment in self._middle:
            first = text.rfind(segment, lo, first)
            if first < 0:
                return None
        return text[lo:first]

    def match(self, text: str) -> bool:
        return self.star(text) is not None


class Globs:
    """Any of several globs."""

    __slots__ = ("_globs",)

    def __init__(self, patterns: Iterable[str]) -> None:
        self._globs = tuple(Glob(p) for p in patterns)

    def match(self, text: str) -> bool:
        return any(g.star(text) is not None for g in self._globs)


def glob_matcher(patterns: Iterable[str]) -> Globs | None:
    """One matcher for a list of `*` globs; None when the list is empty."""
    globs = Globs(patterns)
    return globs if globs._globs else None


class Aliases:
    """Tag → canonical name, with a per-tag cache (tags are few, points are many)."""

    def __init__(self, table: AliasTable | None = None) -> None:
        self._exact: dict[str, str] = {}
        self._spelled: dict[str, str] = {}  # spelling(tag) → canonical, for unseen spellings
        self._patterns: list[tuple[Glob, str]] = []
        self._cache: dict[str, str] = {}
        self.table: dict[str, tuple[str, ...]] = {}
        self._add(SHIPPED if table is None else table)

    def _add(self, table: AliasTable) -> None:
        pairs = table.items() if isinstance(table, Mapping) else table
        for canonical, tags in pairs:
            tags = tuple(tags)
            self.table[canonical] = self.table.get(canonical, ()) + tags
            for tag in tags:
                if "*" in tag:
                    self._patterns.append((Glob(tag), canonical))
                else:
                    self._exact[tag] = canonical
                    self._spelled.setdefault(spelling(tag), canonical)

    def extended(self, table: AliasTable) -> Aliases:
        """A new table where `table`'s entries win over this one's."""
        out = Aliases(table)  # user patterns first: first match wins
        user_exact = dict(out._exact)
        out._add(self.table)
        out._exact.update(user_exact)
        return out

    def resolve(self, tag: str) -> str:
        hit = self._cache.get(tag)
        if hit is not None:
            return hit
        canonical = self._exact.get(tag)
        if canonical is None:
            canonical = self._spelled.get(spelling(tag), tag)
            for glob, target in self._patterns:
                star = glob.star(tag)
                if star is not None:
                    canonical = target.replace("*", star, 1) if "*" in target else target
                    break
        self._cache[tag] = canonical
        return canonical
