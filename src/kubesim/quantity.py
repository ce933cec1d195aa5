"""Resource quantities (`500m`, `64Gi`, `1e3`) as exact numbers, and the integer forms the
scheduler and kubelet compare: CPU in millicores, everything else in whole units rounded up."""

from __future__ import annotations

import functools
import math
import re
from fractions import Fraction
from typing import Any

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}
_FORM = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+))(Ki|Mi|Gi|Ti|Pi|Ei|[eE][+-]?\d+|[numkMGTPE]?)$")


@functools.lru_cache(maxsize=4096)
def _parse(text: str) -> Fraction:
    match = _FORM.match(text.strip())
    if match is None:
        raise ValueError(
            f"quantities must match the regular expression "
            f"'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$': {text!r}"
        )
    number = Fraction(match.group(1))
    suffix = match.group(2)
    if suffix in _BINARY:
        return number * _BINARY[suffix]
    if suffix[:1] in ("e", "E"):
        return number * Fraction(10) ** int(suffix[1:])
    return number * _DECIMAL[suffix]


def parse(value: Any) -> Fraction:
    """The exact value of a quantity given as a string or a number."""
    if isinstance(value, bool):
        raise ValueError(f"a quantity cannot be a boolean: {value!r}")
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, float):
        return Fraction(value).limit_denominator(10**9)
    return _parse(str(value))


def milli(value: Any) -> int:
    """The quantity in thousandths, rounded up (how CPU is compared)."""
    return math.ceil(parse(value) * 1000)


def units(value: Any) -> int:
    """The quantity in whole units, rounded up (how memory and extended resources are compared)."""
    return math.ceil(parse(value))
