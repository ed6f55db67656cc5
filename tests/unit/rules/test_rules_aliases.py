"""The alias table: what writers call a metric resolves to the name rules are written against."""

from __future__ import annotations

import pytest
from support.series import evaluate, points, ruleset

from trainsentry.rules.aliases import Aliases

WRITERS = {
    # tensorboardX / PyTorch tutorial style
    "LearningRate": "lr",
    "Time/step": "step_time",
    # Keras' TensorBoard callback with update_freq="batch", custom metrics included
    "train/batch_grad_norm": "grad_norm",
    "train/batch_learning_rate": "lr",
    "train/batch_step_time": "step_time",
    # Lightning: the grad_norm utility, LearningRateMonitor, on_step + on_epoch logging
    "grad_2.0_norm_total": "grad_norm",
    "grad_2.0_norm/layer1.weight": "grad_norm/layer1.weight",
    "lr-AdamW": "lr",
    "lr-SGD/pg2": "lr",
    "train_loss_step": "loss",
    "train_loss_epoch": "loss",
    # HF Trainer and plain loops
    "learning_rate": "lr",
    "train/lr": "lr",
    "eval_loss": "val_loss",
    "val/loss": "val_loss",
    "valid_loss": "val_loss",
    # step time as other loggers name it
    "iteration_time": "step_time",
    "iteration-time": "step_time",
    "time/step": "step_time",
    "perf/step_time": "step_time",
    # work per second: the inverse of step time, kept apart (see the default pack)
    "throughput": "throughput",
    "samples_per_second": "throughput",
}


@pytest.mark.parametrize(("tag", "canonical"), sorted(WRITERS.items()))
def test_writer_conventions_resolve_to_canonical_names(tag: str, canonical: str) -> None:
    assert Aliases().resolve(tag) == canonical


@pytest.mark.parametrize(
    ("tag", "canonical"),
    [
        ("Learning_Rate", "lr"),
        ("learningRate", "lr"),
        ("Step-Time", "step_time"),
        ("Val_Loss", "val_loss"),
        ("GRAD_NORM", "grad_norm"),
        ("Loss/Train", "loss"),
    ],
)
def test_an_unseen_spelling_of_a_known_tag_resolves_too(tag: str, canonical: str) -> None:
    assert Aliases().resolve(tag) == canonical


def test_unknown_tags_stay_themselves() -> None:
    aliases = Aliases()
    assert aliases.resolve("something/else") == "something/else"
    assert aliases.resolve("probe/grad_norm_total") == "probe/grad_norm_total"
    assert aliases.resolve("eval_samples_per_second") == "eval_samples_per_second"


def test_a_user_alias_wins_over_a_shipped_spelling() -> None:
    # the user says their `Learning_Rate` is something else; case folding must not override
    table = Aliases().extended({"warmup_factor": ["Learning_Rate"]})
    assert table.resolve("Learning_Rate") == "warmup_factor"
    assert table.resolve("LearningRate") == "lr"


def test_a_rule_on_lr_sees_the_tutorial_writers_learning_rate() -> None:
    rules = ruleset("- {name: zero, metric: lr, threshold: {below: 1.0e-12}, for: 3 points}")
    got = evaluate(rules, points("0.001x5 0x5", tag="LearningRate"))
    assert [(t.rule, t.metric, t.canonical, t.step) for t in got] == [
        ("zero", "LearningRate", "lr", 8)
    ]
