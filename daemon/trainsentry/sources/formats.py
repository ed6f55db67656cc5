"""The decoder for each kind of log file that discover.classify() recognises."""

from __future__ import annotations

from trainsentry.sources.base import Decoder


def new_decoder(kind: str) -> Decoder:
    # Imported here so that a daemon watching only JSONL never loads protobuf.
    if kind == "tfevents":
        from trainsentry.sources.tfevents import TfEventsDecoder

        return TfEventsDecoder()
    if kind == "jsonl":
        from trainsentry.sources.jsonl import JsonlDecoder

        return JsonlDecoder()
    if kind == "csv":
        from trainsentry.sources.csvlog import CsvDecoder

        return CsvDecoder()
    if kind == "wandb":
        from trainsentry.sources.wandb_records import WandbDecoder

        return WandbDecoder()
    if kind == "mlflow_metric":
        from trainsentry.sources.mlflow_files import MlflowMetricDecoder

        return MlflowMetricDecoder()
    if kind == "text":
        from trainsentry.sources.textlog import LogDecoder

        return LogDecoder()
    raise ValueError(f"unknown log kind {kind!r}")
