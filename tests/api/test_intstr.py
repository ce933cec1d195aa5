"""Int-or-percent checks and scaling."""

from __future__ import annotations

import pytest

from gpu_operator.api import intstr


@pytest.mark.parametrize(
    ("value", "total", "round_up", "expected"),
    [
        ("25%", 10, True, 3),
        ("25%", 10, False, 2),
        ("100%", 7, True, 7),
        ("0%", 50, True, 0),
        (2, 10, True, 2),
        ("1", 10, True, 1),
        ("50%", 1, True, 1),
        ("50%", 1, False, 0),
    ],
)
def test_scaled_value(value: int | str, total: int, round_up: bool, expected: int) -> None:
    assert intstr.scaled_value(value, total, round_up=round_up) == expected


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("abc", 'expected an integer or a percentage like "25%", got "abc"'),
        (-1, "expected a non-negative integer, got -1"),
        ("150%", "between 0% and 100%"),
        ("3", "write the number without quotes"),
        (True, "got True"),
        (1.5, "got 1.5"),
    ],
)
def test_bad_values_are_explained(value: object, message: str) -> None:
    with pytest.raises(intstr.IntOrPercentError, match=message.replace("(", r"\(")):
        intstr.check(value)


def test_digit_strings_allowed_where_upstream_parses_them() -> None:
    assert intstr.check("1", allow_digit_string=True) == "1"
