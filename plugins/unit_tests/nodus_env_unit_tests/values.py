"""Python values as tagged JSON, so results cross the process boundary as plain data.

The completion's process encodes what the function returned; the grader decodes it into exact builtin
types. Nothing the completion defines survives the trip: an object with a rigged ``__eq__`` (or an ``int``
subclass) arrives as an :class:`Opaque` that equals nothing, and a subclass of list, tuple, dict, set or
frozenset (a ``Counter``, a namedtuple) as its builtin base with the same contents, which it equals under ``==``.

``ENCODER_SOURCE`` is executed inside the completion's process (the harness embeds it), and here.
"""

from __future__ import annotations

import math
from typing import Any

ENCODER_SOURCE = """
def _nodus_encode(value, depth=0):
    kind = type(value)
    if depth > 50:
        return {"opaque": "too deeply nested"}
    if kind is int and value.bit_length() > 10000:
        # In hex: Python refuses to write (and read) decimal ints over 4300 digits (sys.set_int_max_str_digits),
        # and a correct function may well return one. Hex has no such limit, and changing the limit would change
        # it for the whole grader process.
        return {"int": hex(value)}
    if value is None or kind is bool or kind is str or kind is int or kind is float:
        return value
    # Subclasses of the containers (Counter, defaultdict, OrderedDict, a namedtuple) arrive as their builtin
    # base, which they equal under ==. Their contents are read through the base's own methods, so overriding
    # __iter__ or items() changes nothing, and whatever __eq__ they define is left behind. An OrderedDict is
    # read through OrderedDict.items: dict.items gives the order of its storage, not its own (after
    # move_to_end, say), and a test may check the order of the dict that arrives.
    if isinstance(value, list):
        return [_nodus_encode(item, depth + 1) for item in list.__iter__(value)]
    if isinstance(value, tuple):
        return {"tuple": [_nodus_encode(item, depth + 1) for item in tuple.__iter__(value)]}
    if isinstance(value, dict):
        from collections import OrderedDict as ordered

        items = ordered.items if isinstance(value, ordered) else dict.items
        return {"dict": [[_nodus_encode(k, depth + 1), _nodus_encode(v, depth + 1)] for k, v in items(value)]}
    if isinstance(value, frozenset):
        return {"frozenset": [_nodus_encode(item, depth + 1) for item in frozenset.__iter__(value)]}
    if isinstance(value, set):
        return {"set": [_nodus_encode(item, depth + 1) for item in set.__iter__(value)]}
    if kind is complex:
        return {"complex": [value.real, value.imag]}
    if kind is bytes:
        return {"bytes": value.hex()}
    return {"opaque": kind.__name__}
"""

namespace: dict[str, Any] = {}
exec(ENCODER_SOURCE, namespace)  # one definition for both sides
encode = namespace["_nodus_encode"]


class Opaque:
    """A value the completion returned that is not plain data: equal to nothing, not even itself."""

    def __init__(self, type_name: str) -> None:
        self.type_name = type_name

    def __eq__(self, other: object) -> bool:
        return False

    def __ne__(self, other: object) -> bool:
        return True

    __hash__ = object.__hash__

    def __repr__(self) -> str:
        return f"<{self.type_name} object>"


def decode(data: Any) -> Any:
    if isinstance(data, list):
        return [decode(item) for item in data]
    if not isinstance(data, dict):
        return data
    ((tag, payload),) = data.items()
    if tag == "tuple":
        return tuple(decode(item) for item in payload)
    if tag == "dict":
        return {decode(key): decode(value) for key, value in payload}
    if tag == "set":
        return {decode(item) for item in payload}
    if tag == "frozenset":
        return frozenset(decode(item) for item in payload)
    if tag == "int":
        return int(payload, 16)
    if tag == "complex":
        return complex(*payload)
    if tag == "bytes":
        return bytes.fromhex(payload)
    return Opaque(str(payload))


def same(expected: Any, got: Any) -> bool:
    """Type-strict equality, expected on the left: ``1 != 1.0 != True``; floats equal within 1e-9."""
    if type(got) is not type(expected):
        return False
    if isinstance(expected, float):
        return math.isclose(expected, got, rel_tol=1e-9, abs_tol=1e-12) or (math.isnan(expected) and math.isnan(got))
    if isinstance(expected, list | tuple):
        return len(expected) == len(got) and all(same(e, g) for e, g in zip(expected, got, strict=True))
    if isinstance(expected, dict):
        return expected.keys() == got.keys() and all(same(value, got[key]) for key, value in expected.items())
    return bool(expected == got)
