"""Cron schedules as CronJobs read them: five fields, ranges, steps, names and `@` macros.

The grammar is the standard one the CronJob controller accepts: minute, hour, day of month,
month (1-12 or JAN-DEC), day of week (0-6 or SUN-SAT); `*` and `?`, lists, `a-b` ranges and `/n`
steps; `@yearly`, `@annually`, `@monthly`, `@weekly`, `@daily`, `@midnight`, `@hourly` and
`@every <duration>`. When both day fields are restricted a day matching either one fires, when one
is `*` both must match. Times are computed on the wall clock of the schedule's time zone.
"""

from __future__ import annotations

import datetime as dt
import re
import zoneinfo
from dataclasses import dataclass

_MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_MONTHS = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
_DAYS = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"]
# (low, high, names starting at `low`) per field
_FIELDS = (
    (0, 59, None),
    (0, 23, None),
    (1, 31, None),
    (1, 12, _MONTHS),
    (0, 6, _DAYS),
)
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(h|ms|m|s|us|µs|ns)")
_UNIT_SECONDS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}


class ScheduleError(ValueError):
    """A schedule string the controller cannot parse."""


@dataclass(frozen=True)
class Schedule:
    """A parsed schedule: the allowed values of each field, or a fixed `@every` interval."""

    minutes: frozenset[int] = frozenset()
    hours: frozenset[int] = frozenset()
    days: frozenset[int] = frozenset()
    months: frozenset[int] = frozenset()
    weekdays: frozenset[int] = frozenset()
    days_star: bool = True
    weekdays_star: bool = True
    every: float | None = None

    def next_after(self, moment: dt.datetime, tz: dt.tzinfo = dt.UTC) -> dt.datetime:
        """The first firing time strictly after `moment` (aware), as an aware UTC datetime."""
        if self.every is not None:
            base = moment.replace(microsecond=0)
            return (base + dt.timedelta(seconds=self.every)).astimezone(dt.UTC)
        wall = moment.astimezone(tz).replace(tzinfo=None, second=0, microsecond=0)
        wall += dt.timedelta(minutes=1)
        limit = wall + dt.timedelta(days=366 * 5)
        while wall < limit:
            if wall.month not in self.months:
                year, month = (
                    (wall.year + 1, 1) if wall.month == 12 else (wall.year, wall.month + 1)
                )
                wall = dt.datetime(year, month, 1)
                continue
            if not self._day_matches(wall):
                wall = dt.datetime(wall.year, wall.month, wall.day) + dt.timedelta(days=1)
                continue
            if wall.hour not in self.hours:
                wall = wall.replace(minute=0) + dt.timedelta(hours=1)
                continue
            if wall.minute not in self.minutes:
                wall += dt.timedelta(minutes=1)
                continue
            aware = wall.replace(tzinfo=tz)
            utc = aware.astimezone(dt.UTC)
            # Wall times inside a daylight-saving gap do not exist; skip them.
            if utc.astimezone(tz).replace(tzinfo=None) != wall or utc <= moment:
                wall += dt.timedelta(minutes=1)
                continue
            return utc
        raise ScheduleError("no time in the next five years matches the schedule")

    def _day_matches(self, wall: dt.datetime) -> bool:
        day = wall.day in self.days
        weekday = (wall.isoweekday() % 7) in self.weekdays
        if self.days_star or self.weekdays_star:
            return day and weekday
        return day or weekday

    def most_recent(
        self, earliest: dt.datetime, now: dt.datetime, tz: dt.tzinfo = dt.UTC
    ) -> tuple[dt.datetime | None, int]:
        """The latest firing time in (earliest, now] and how many firings that range holds.

        The count is exact up to 100 and reported as 101 beyond (the controller only needs to
        know "too many"); the latest time is found by narrowing the search window.
        """
        first = self.next_after(earliest, tz)
        if first > now:
            return None, 0
        latest = first
        count = 1
        current = first
        while count <= 100:
            current = self.next_after(current, tz)
            if current > now:
                return latest, count
            latest = current
            count += 1
        for window in (3600, 86400, 31 * 86400, 366 * 86400):
            start = now - dt.timedelta(seconds=window)
            if start <= latest:
                break
            found = self._latest_from(start, now, tz)
            if found is not None:
                return found, count
        return self._latest_from(latest, now, tz) or latest, count

    def _latest_from(
        self, start: dt.datetime, now: dt.datetime, tz: dt.tzinfo
    ) -> dt.datetime | None:
        latest = None
        current = self.next_after(start, tz)
        while current <= now:
            latest = current
            current = self.next_after(current, tz)
        return latest


def parse(text: str) -> Schedule:
    """Parse a CronJob schedule; raises ScheduleError with the reason."""
    spec = text.strip()
    if spec.startswith("@every"):
        return Schedule(every=_parse_every(spec[len("@every") :].strip()))
    if spec.startswith("@"):
        if spec not in _MACROS:
            raise ScheduleError(f"unrecognized descriptor: {spec}")
        spec = _MACROS[spec]
    fields = spec.split()
    if len(fields) != 5:
        raise ScheduleError(f"expected exactly 5 fields, found {len(fields)}: [{' '.join(fields)}]")
    parsed = []
    stars = []
    for value, (low, high, names) in zip(fields, _FIELDS, strict=True):
        values, star = _parse_field(value, low, high, names)
        parsed.append(values)
        stars.append(star)
    return Schedule(
        minutes=parsed[0],
        hours=parsed[1],
        days=parsed[2],
        months=parsed[3],
        weekdays=parsed[4],
        days_star=stars[2],
        weekdays_star=stars[4],
    )


def _parse_field(
    text: str, low: int, high: int, names: list[str] | None
) -> tuple[frozenset[int], bool]:
    values: set[int] = set()
    star = False
    for part in text.split(","):
        range_part, _, step_part = part.partition("/")
        step = 1
        if step_part:
            step = _number(step_part, None, low)
            if step <= 0:
                raise ScheduleError(f"step of range should be a positive number: {part}")
        if range_part in ("*", "?"):
            start, end = low, high
            star = star or step == 1
        else:
            first, dash, last = range_part.partition("-")
            start = _number(first, names, low)
            end = _number(last, names, low) if dash else (high if step_part else start)
        if start < low:
            raise ScheduleError(f"beginning of range ({start}) below minimum ({low}): {part}")
        if end > high:
            raise ScheduleError(f"end of range ({end}) above maximum ({high}): {part}")
        if start > end:
            raise ScheduleError(f"beginning of range ({start}) beyond end of range ({end}): {part}")
        values.update(range(start, end + 1, step))
    return frozenset(values), star


def _number(text: str, names: list[str] | None, low: int) -> int:
    if names is not None and text.lower() in names:
        return names.index(text.lower()) + low
    try:
        return int(text)
    except ValueError as exc:
        raise ScheduleError(
            f'failed to parse int from {text}: strconv.Atoi: parsing "{text}": invalid syntax'
        ) from exc


def _parse_every(text: str) -> float:
    parts = list(_DURATION.finditer(text))
    if not text or "".join(m.group(0) for m in parts) != text:
        raise ScheduleError(
            f'failed to parse duration @every {text}: time: invalid duration "{text}"'
        )
    seconds = sum(float(m.group(1)) * _UNIT_SECONDS[m.group(2)] for m in parts)
    # Upstream rounds the interval down to whole seconds, with a one-second minimum.
    return max(1.0, float(int(seconds)))


def time_zone(name: str | None) -> dt.tzinfo:
    """The tzinfo for a CronJob `timeZone` (None is the controller's zone, UTC here)."""
    if not name:
        return dt.UTC
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError) as exc:
        raise ScheduleError(f"unknown time zone {name}") from exc
