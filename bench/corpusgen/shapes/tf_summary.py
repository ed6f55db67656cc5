"""The part of `tf.summary` that Keras' TensorBoard callback calls, on tensorboard's writer.

Keras 3 runs on torch here, but its TensorBoard callback writes through
`tensorflow.summary`, and TensorFlow is not installed. This stand-in gives
the callback the same API with TF2's semantics (a default writer and step
set by `as_default`, a global `record_if` condition, nothing written without
a default writer) and writes what TF2 writes: tensor-encoded float32 scalars
with the scalars plugin's metadata, through tensorboard's EventFileWriter,
in event files named like TF2's (`.v2`). Everything else in the callback —
which tags, which steps, which writer, when — is Keras' own code.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.plugins.scalar.summary_v2 import scalar_pb
from tensorboard.summary.writer.event_file_writer import EventFileWriter
from tensorboard.util import tensor_util


class _Writer:
    """One `tf.summary.create_file_writer` writer."""

    def __init__(self, owner: TfSummary, logdir: str) -> None:
        self._owner = owner
        self._events = EventFileWriter(logdir, filename_suffix=f".{os.getpid()}.0.v2")

    @contextlib.contextmanager
    def as_default(self, step: Any = None) -> Iterator[_Writer]:
        owner = self._owner
        saved = owner.writer, owner.step
        owner.writer = self
        if step is not None:
            owner.step = step
        try:
            yield self
        finally:
            owner.writer, owner.step = saved

    def add(self, summary: summary_pb2.Summary, step: int) -> None:
        self._events.add_event(event_pb2.Event(wall_time=time.time(), step=step, summary=summary))

    def flush(self) -> None:
        self._events.flush()

    def close(self) -> None:
        self._events.close()


class TfSummary:
    """Set as a Keras TensorBoard callback's `_summary_module`."""

    def __init__(self) -> None:
        self.writer: _Writer | None = None
        self.step: Any = None
        self._record: bool | Callable[[], bool] = True

    def create_file_writer(self, logdir: str) -> _Writer:
        return _Writer(self, logdir)

    @contextlib.contextmanager
    def record_if(self, condition: bool | Callable[[], bool]) -> Iterator[None]:
        saved = self._record
        self._record = condition
        try:
            yield
        finally:
            self._record = saved

    def _target(self, step: Any) -> tuple[_Writer, int] | None:
        record = self._record() if callable(self._record) else self._record
        step = self.step if step is None else step
        if self.writer is None or not record or step is None:
            return None
        return self.writer, int(np.asarray(step))

    def scalar(self, name: str, data: Any, step: Any = None, description: Any = None) -> bool:
        target = self._target(step)
        if target is None:
            return False
        writer, at = target
        writer.add(scalar_pb(name, float(np.asarray(data))), at)
        return True

    def write(self, tag: str, tensor: Any, step: Any = None, metadata: Any = None) -> bool:
        """A raw tensor summary (Keras' model-config JSON goes through here)."""
        target = self._target(step)
        if target is None:
            return False
        writer, at = target
        value = summary_pb2.Summary.Value(tag=tag, tensor=tensor_util.make_tensor_proto(tensor))
        if metadata is not None:
            value.metadata.CopyFrom(metadata)
        writer.add(summary_pb2.Summary(value=[value]), at)
        return True

    def histogram(self, *_a: Any, **_k: Any) -> bool:
        return False  # histogram_freq is 0 by default: Keras never calls this

    def graph(self, *_a: Any, **_k: Any) -> None:
        return None  # torch train functions have no graph to write


def keras_model_summary(summary: TfSummary) -> Callable[..., bool]:
    """Keras' `keras_model_summary` (it imports TensorFlow itself), on the stand-in."""

    def write_model(name: str, data: Any, step: Any = None) -> bool:
        meta = summary_pb2.SummaryMetadata()
        meta.plugin_data.plugin_name = "graph_keras_model"
        meta.plugin_data.content = b"1"
        try:
            json_string = data.to_json()
        except Exception:  # Keras ignores models it cannot serialise
            return False
        return summary.write(tag=name, tensor=json_string, step=step, metadata=meta)

    return write_model
