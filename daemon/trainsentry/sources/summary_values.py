"""Non-scalar summary payloads → the scalars rules can watch.

The slow tier of the event decoder: tensors of any dtype by TensorFlow's own
rules (typed fields, tensor_content, the last element repeated to fill the
shape), and histograms — HistogramProto and TF2's [k, 3] bucket tensors —
reduced to derived scalars, so a rule can watch `weights/mean` or the
fraction of dead units without a histogram type of its own.
"""

from __future__ import annotations

import math
import struct
import sys
from typing import Any

from tensorboard.compat.proto import summary_pb2, tensor_pb2, types_pb2

from trainsentry.point import Sample

_CONTENT_FORMATS = {
    types_pb2.DT_FLOAT: "f", types_pb2.DT_DOUBLE: "d", types_pb2.DT_HALF: "e",
    types_pb2.DT_INT8: "b", types_pb2.DT_INT16: "h", types_pb2.DT_INT32: "i",
    types_pb2.DT_INT64: "q", types_pb2.DT_UINT8: "B", types_pb2.DT_UINT16: "H",
    types_pb2.DT_UINT32: "I", types_pb2.DT_UINT64: "Q", types_pb2.DT_BOOL: "?",
}  # fmt: skip
_TYPED_FIELDS = {
    types_pb2.DT_FLOAT: "float_val", types_pb2.DT_DOUBLE: "double_val",
    types_pb2.DT_HALF: "half_val", types_pb2.DT_BFLOAT16: "half_val",
    types_pb2.DT_INT8: "int_val", types_pb2.DT_INT16: "int_val", types_pb2.DT_INT32: "int_val",
    types_pb2.DT_UINT8: "int_val", types_pb2.DT_UINT16: "int_val",
    types_pb2.DT_INT64: "int64_val", types_pb2.DT_UINT32: "uint32_val",
    types_pb2.DT_UINT64: "uint64_val", types_pb2.DT_BOOL: "bool_val",
}  # fmt: skip


def tensor_values(tensor: tensor_pb2.TensorProto) -> list[float] | None:
    """A numeric tensor's elements as floats, by TensorFlow's rules; None if not numeric."""
    count = math.prod(dim.size for dim in tensor.tensor_shape.dim)
    if not 0 <= count <= 1 << 20:  # unknown (-1) or absurd: nothing a scalar or histogram has
        return None
    dtype = tensor.dtype
    raw = tensor.tensor_content
    if raw:
        if dtype == types_pb2.DT_BFLOAT16:  # the high half of a float32
            raw = b"".join(b"\0\0" + raw[i : i + 2] for i in range(0, len(raw), 2))
            code = "f"
        else:
            code = _CONTENT_FORMATS.get(dtype, "")
        if not code or len(raw) != struct.calcsize(code) * count:
            return None
        return [float(x) for x in struct.unpack(f"<{count}{code}", raw)]
    field = _TYPED_FIELDS.get(dtype)
    if field is None:
        return None
    typed: list[Any] = list(getattr(tensor, field))
    if dtype == types_pb2.DT_HALF:
        typed = [struct.unpack("<e", struct.pack("<H", h & 0xFFFF))[0] for h in typed]
    elif dtype == types_pb2.DT_BFLOAT16:
        typed = [struct.unpack("<f", struct.pack("<I", (h & 0xFFFF) << 16))[0] for h in typed]
    if len(typed) > count:
        return None
    # TensorFlow repeats the last element to fill the shape (zeros when there is none).
    typed += [typed[-1] if typed else 0] * (count - len(typed))
    return [float(x) for x in typed]


def histo_buckets(histo: summary_pb2.HistogramProto) -> list[tuple[float, float, float]]:
    """(left, right, count) rows the way TensorBoard migrates HistogramProto (data_compat)."""
    counts = list(histo.bucket)
    nonzero = [i for i, c in enumerate(counts) if c > 0]
    if not nonzero:
        return []
    first, last = nonzero[0], nonzero[-1]
    inner = list(histo.bucket_limit[first:last])
    lefts = [histo.min, *inner]
    rights = [*inner, histo.max]
    return list(zip(lefts, rights, counts[first : last + 1], strict=False))


def histogram_samples(
    tag: str,
    step: int,
    wall_time: float,
    rows: list[tuple[float, float, float]],
    exact: summary_pb2.HistogramProto | None,
) -> list[Sample]:
    """A histogram reduced to the scalars rules can watch.

    Bucketed data loses the values, so these are approximations where the
    format forces them. HistogramProto carries exact min, max, sum and sum of
    squares, so its mean/std/min/max are exact. TF2's [k, 3] tensors carry only
    buckets: mean and std treat each bucket's mass as sitting at its centre,
    min/max are the outer edges of the outermost non-empty buckets. zero_frac is
    always the mass of the buckets whose closed interval contains 0 over the
    total: with the fine default bins of torch/tensorboardX (±1e-12 around 0) it
    is the fraction of exact zeros (dead units); with coarse bins (TF2's 30
    uniform buckets, numpy's "auto") it over-counts the values near 0.
    """
    total = sum(c for _, _, c in rows)
    if exact is not None and exact.num > 0:
        mean = exact.sum / exact.num
        var = exact.sum_squares / exact.num - mean * mean
        lo, hi = exact.min, exact.max
    elif total > 0:
        mean = sum(c * (left + right) / 2 for left, right, c in rows) / total
        var = sum(c * (left + right) * (left + right) / 4 for left, right, c in rows) / total
        var -= mean * mean
        lo = next(left for left, _, c in rows if c > 0)
        hi = next(right for _, right, c in reversed(rows) if c > 0)
    else:
        return []
    zero = sum(c for left, right, c in rows if left <= 0 <= right)
    derived = {
        "mean": mean,
        "std": math.sqrt(max(var, 0.0)),
        "min": lo,
        "max": hi,
        "zero_frac": zero / total if total > 0 else 0.0,
    }
    return [Sample(sys.intern(f"{tag}/{k}"), step, wall_time, v) for k, v in derived.items()]
