"""Int-or-percent values (maxUnavailable and friends), checked and scaled like Kubernetes does."""

from __future__ import annotations

import math
import re

_PERCENT = re.compile(r"^(\d+)%$")
_DIGITS = re.compile(r"^\d+$")


class IntOrPercentError(ValueError):
    """A value that is neither a non-negative integer nor a percentage."""


def describe(value: object) -> str:
    return f'"{value}"' if isinstance(value, str) else repr(value)


def check(value: object, *, allow_digit_string: bool = False) -> int | str:
    """Return the value when it is a non-negative integer or a percentage such as "25%".

    `allow_digit_string` accepts "1" as well: upstream parses string-typed fields (for example
    `daemonsets.rollingUpdate.maxUnavailable`) with `intstr.Parse`, which turns digits into an int.
    """
    expected = 'an integer or a percentage like "25%"'
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise IntOrPercentError(f"expected {expected}, got {describe(value)}")
    if isinstance(value, int):
        if value < 0:
            raise IntOrPercentError(f"expected a non-negative integer, got {value}")
        return value
    match = _PERCENT.match(value)
    if match:
        if int(match.group(1)) > 100:
            raise IntOrPercentError(f"expected a percentage between 0% and 100%, got {value!r}")
        return value
    if allow_digit_string and _DIGITS.match(value):
        return value
    hint = " (write the number without quotes)" if _DIGITS.match(value) else ""
    raise IntOrPercentError(f"expected {expected}, got {describe(value)}{hint}")


def scaled_value(value: int | str, total: int, *, round_up: bool) -> int:
    """Resolve an int-or-percent against a total (e.g. 25% of 10 nodes rounded up is 3)."""
    checked = check(value, allow_digit_string=True)
    if isinstance(checked, int):
        return checked
    if _DIGITS.match(checked):
        return int(checked)
    percent = int(checked[:-1])
    exact = percent * total / 100
    return math.ceil(exact) if round_up else math.floor(exact)
