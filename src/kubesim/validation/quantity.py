"""Resource quantities: parsing, comparison and the canonical form the server stores.

The server re-serialises every quantity canonically: decimal values use the largest SI suffix
that keeps an integer mantissa (`0.5` -> `500m`, `1000` -> `1k`), binary values (Ki, Mi, ...)
keep a binary suffix when they are whole and at least 1024 (`1.5Gi` -> `1536Mi`), and anything
finer than a nano unit is rounded up.
"""

from __future__ import annotations

import functools
import re
from decimal import ROUND_CEILING, Decimal, InvalidOperation

FORMAT_ERROR = (
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
)
SUFFIX_ERROR = "unable to parse quantity's suffix"

_SHAPE = re.compile(r"^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$")
_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_SUFFIX_FOR_EXPONENT = {v: k for k, v in _DECIMAL.items()}


class QuantityError(ValueError):
    """A string that is not a quantity; the message is the server's."""


def parse(text: str) -> tuple[Decimal, str]:
    """The value and format (`DecimalSI`, `BinarySI` or `DecimalExponent`) of a quantity."""
    text = text.strip()
    match = _SHAPE.match(text)
    if not match:
        raise QuantityError(FORMAT_ERROR)
    number, suffix = match.groups()
    if number.count(".") > 1 or number.strip("+-") in ("", "."):
        raise QuantityError(FORMAT_ERROR)
    try:
        base = Decimal(number)
    except InvalidOperation as exc:
        raise QuantityError(FORMAT_ERROR) from exc
    if suffix in _BINARY:
        return base * (Decimal(1024) ** _BINARY[suffix]), "BinarySI"
    if suffix in _DECIMAL:
        return base.scaleb(_DECIMAL[suffix]), "DecimalSI"
    exponent = re.fullmatch(r"[eE]([-+]?[0-9]+)", suffix)
    if exponent:
        return base.scaleb(int(exponent.group(1))), "DecimalExponent"
    raise QuantityError(SUFFIX_ERROR)


def value(text: str) -> Decimal:
    """The numeric value of a quantity string."""
    return parse(text)[0]


@functools.lru_cache(maxsize=4096)
def canonical(text: str) -> str:
    """The form the server stores a quantity in."""
    amount, fmt = parse(text)
    return format_amount(amount, fmt)


def format_amount(amount: Decimal, fmt: str = "DecimalSI") -> str:
    """A value written canonically in a format."""
    # Anything finer than nano units is rounded up, as the server does.
    amount = amount.quantize(Decimal("1e-9"), rounding=ROUND_CEILING)
    if amount == 0:
        return "0"
    if fmt == "BinarySI" and amount == amount.to_integral_value() and abs(amount) >= 1024:
        whole = int(amount)
        power = 0
        while power < 6 and whole % 1024 == 0:
            whole //= 1024
            power += 1
        suffix = next((k for k, v in _BINARY.items() if v == power), "")
        return f"{whole}{suffix}"
    sign, digits, exponent = amount.normalize().as_tuple()
    assert isinstance(exponent, int)
    mantissa = int("".join(map(str, digits)))
    while exponent % 3:
        mantissa *= 10
        exponent -= 1
    while exponent > 18:
        mantissa *= 10
        exponent -= 1
    while mantissa % 1000 == 0 and exponent < 18:
        mantissa //= 1000
        exponent += 3
    text = f"{'-' if sign else ''}{mantissa}"
    if fmt == "DecimalExponent":
        return text if exponent == 0 else f"{text}e{exponent}"
    return text + _SUFFIX_FOR_EXPONENT[exponent]


def from_number(number: int | float) -> str:
    """A JSON number written as the quantity the server stores."""
    return format_amount(Decimal(repr(number)) if isinstance(number, float) else Decimal(number))
