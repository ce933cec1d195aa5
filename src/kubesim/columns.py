"""What every printer column is built from: the column type and the cells that all tables share
(name, age, kubectl's human durations). `tables` (the generic Table output) and `printers` (the
built-in types' columns) both build on this module.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

from kubesim.store import parse_time

Column = tuple[str, str, int, Callable[[dict[str, Any]], Any]]


def age(obj: dict[str, Any]) -> str:
    """Human age like kubectl prints it (5s, 3m, 2h, 4d)."""
    created = (obj.get("metadata") or {}).get("creationTimestamp")
    if not created:
        return "<unknown>"
    return duration((dt.datetime.now(dt.UTC) - parse_time(created)).total_seconds())


def duration(seconds: float) -> str:
    """A duration as the printers' HumanDuration writes it (`45s`, `3m20s`, `5h10m`, `3d4h`)."""
    total = int(seconds)
    # Up to two seconds in the future is clock skew between machines: "now".
    if total < -1:
        return "<invalid>"
    if total < 0:
        return "0s"
    if total < 120:
        return f"{total}s"
    minutes = total // 60
    if minutes < 10:
        return f"{minutes}m{total % 60}s" if total % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = total // 3600
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        return f"{hours // 24}d{hours % 24}h" if hours % 24 else f"{hours // 24}d"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        days = (hours // 24) % 365
        return f"{hours // 24 // 365}y{days}d" if days else f"{hours // 24 // 365}y"
    return f"{hours // 24 // 365}y"


def _name(obj: dict[str, Any]) -> str:
    return str(obj["metadata"]["name"])


NAME: Column = ("Name", "string", 0, _name)
AGE: Column = ("Age", "string", 0, age)
