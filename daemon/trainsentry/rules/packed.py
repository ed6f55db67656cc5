"""Windows pickled as flat lists of floats: the alert-state snapshot's cost.

A fleet's state is mostly the conditions' windows, deques of small float
tuples. Pickled as they are, every tuple is an entry in the pickler's memo
(floats are not memoised): at 1,000 runs x 20 series that was 125,000 memo
entries, most of the snapshot's time and of its passing memory. Flattened,
a window is one list of floats; unpacking rebuilds the same deque, maxlen
included, on restore, which happens once per start. (A list, not an
`array('d')`: filling an array from an iterator costs more than pickling
the floats, measured.) Arrays (the span windows' doubles) are written as
their raw buffers, which protocol 5 does without a copy.
"""

from __future__ import annotations

from array import array
from collections import deque
from itertools import chain
from pickle import PickleBuffer
from typing import Any, ClassVar

PackedDeque = tuple[list[float], int, "int | None"]
_ARRAY = "array"  # marks an array pickled as its raw buffer (see Packed.__getstate__)


def pack(items: deque[Any]) -> PackedDeque:
    """A deque of floats (width 0) or of equal-length float tuples, flattened."""
    width = len(items[0]) if items and isinstance(items[0], tuple) else 0
    flat = list(chain.from_iterable(items) if width else items)
    return flat, width, items.maxlen


def unpack(packed: PackedDeque) -> deque[Any]:
    flat, width, maxlen = packed
    if not width:
        return deque(flat, maxlen)
    columns = [iter(flat)] * width
    return deque(zip(*columns, strict=True), maxlen)


class Packed:
    """Mixin for slotted state classes: the slots named in `_packed` hold deques to pack."""

    __slots__ = ()
    _packed: ClassVar[tuple[str, ...]] = ()

    def __getstate__(self) -> dict[str, Any]:
        slots: tuple[str, ...] = type(self).__slots__
        state = {name: getattr(self, name) for name in slots if hasattr(self, name)}
        for name in self._packed:
            state[name] = pack(state[name])
        for name, value in state.items():
            if type(value) is array:
                # Its buffer, written straight into the pickle (protocol 5). An array's
                # own reduce makes a bytes copy, which the pickler's memo holds to the
                # end of the dump: with full rule windows, the size of the whole state
                # again for the snapshot's length (+80 MB at 1,000 runs, measured).
                state[name] = (_ARRAY, value.typecode, PickleBuffer(value))
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        for name, value in state.items():
            if name in self._packed:
                value = unpack(value)
            elif type(value) is tuple and len(value) == 3 and value[0] == _ARRAY:
                value = array(value[1], value[2])  # the buffer comes back as a bytearray
            setattr(self, name, value)
