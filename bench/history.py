"""Bench history: every bench run appends its figures, with the commit, to bench/history.jsonl;
`trend` prints each figure over the runs and flags regressions, so one is seen the day it lands.

A record is one JSON line:

    {"bench": "operator_scale", "commit": "032ed97+dirty", "date": "2026-11-29T03:40:00Z",
     "machine": {"cores": 2, "load": [6.1, 8.6, 8.4]}, "config": {"nodes": 100},
     "figures": {"steady_requests_per_min": 30.0, ...}, "higher_is_better": []}

Figures are lower-is-better unless named in `higher_is_better` (throughputs). A figure is flagged
when it is more than 25 % worse than the best of the previous five runs of the same bench and
config. Run:

    .venv/bin/python bench/history.py trend                 # every bench
    .venv/bin/python bench/history.py trend operator_scale  # one bench

BENCH_HISTORY names another file (tests use it); BENCH_HISTORY=off records nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PATH = ROOT / "bench" / "history.jsonl"
WINDOW = 5  # a run is compared with the best of this many runs before it
TOLERANCE = 0.25  # more than this much worse than that best is a regression


def history_path() -> Path | None:
    """The history file: BENCH_HISTORY, else bench/history.jsonl; None when recording is off."""
    chosen = os.environ.get("BENCH_HISTORY")
    if chosen == "off":
        return None
    return Path(chosen) if chosen else DEFAULT_PATH


def commit(root: Path = ROOT) -> str:
    """The short commit of the checkout, with "+dirty" when tracked files differ from it."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
            check=True,
        ).stdout.strip()  # fmt: skip
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{head}+dirty" if dirty else head


def machine() -> dict[str, Any]:
    """What the figures depend on besides the code: cores and the load average at the end."""
    try:
        load = [round(value, 2) for value in os.getloadavg()]
    except OSError:
        load = []
    return {"cores": os.cpu_count(), "load": load}


def append(
    bench: str,
    figures: Mapping[str, float],
    *,
    config: Mapping[str, Any] | None = None,
    higher_is_better: Iterable[str] = (),
    path: Path | None = None,
    commit_id: str | None = None,
    note: str | None = None,
) -> dict[str, Any] | None:
    """Append one run's figures; returns the record (None when recording is off)."""
    target = path if path is not None else history_path()
    if target is None:
        return None
    record: dict[str, Any] = {
        "bench": bench,
        "commit": commit_id or commit(),
        "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": machine(),
        "config": dict(config or {}),
        "figures": {name: float(value) for name, value in figures.items()},
        "higher_is_better": sorted(higher_is_better),
    }
    if note:
        record["note"] = note
    target.parent.mkdir(parents=True, exist_ok=True)
    with target.open("a", encoding="utf-8") as out:
        out.write(json.dumps(record, sort_keys=True) + "\n")
    return record


def read(path: Path | None = None) -> list[dict[str, Any]]:
    """Every record, oldest first; a line that is not a record is an error naming the line."""
    source = path if path is not None else (history_path() or DEFAULT_PATH)
    if not source.exists():
        return []
    records = []
    for number, line in enumerate(source.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{source}:{number}: not JSON ({err})") from None
        if not isinstance(record, dict) or not isinstance(record.get("figures"), dict):
            raise ValueError(f"{source}:{number}: a record needs 'bench' and 'figures'")
        records.append(record)
    return records


@dataclass(frozen=True)
class Point:
    commit: str
    date: str
    value: float
    # Set when this value is more than TOLERANCE worse than the best of the WINDOW before it.
    regression_vs: float | None = None


def series_key(record: Mapping[str, Any]) -> str:
    """A bench and its configuration: only runs of the same configuration are compared."""
    config = record.get("config") or {}
    shown = ",".join(f"{k}={config[k]}" for k in sorted(config))
    return f"{record['bench']}[{shown}]" if shown else str(record["bench"])


def worse(value: float, best: float, higher_is_better: bool) -> bool:
    """Whether `value` is more than TOLERANCE worse than `best`."""
    if higher_is_better:
        return value < best * (1 - TOLERANCE)
    if best == 0:
        return value > 0
    return value > best * (1 + TOLERANCE)


def trend(
    records: Iterable[Mapping[str, Any]], bench: str | None = None
) -> dict[str, dict[str, list[Point]]]:
    """Per series (bench and config) and figure, the values over the runs, each regression
    marked against the best of the WINDOW runs before it."""
    out: dict[str, dict[str, list[Point]]] = {}
    for record in records:
        if bench is not None and record.get("bench") != bench:
            continue
        figures = out.setdefault(series_key(record), {})
        higher = set(record.get("higher_is_better") or ())
        for name, value in (record.get("figures") or {}).items():
            points = figures.setdefault(name, [])
            earlier = [p.value for p in points[-WINDOW:]]
            flagged = None
            if earlier:
                best = max(earlier) if name in higher else min(earlier)
                if worse(float(value), best, name in higher):
                    flagged = best
            points.append(
                Point(str(record.get("commit")), str(record.get("date")), float(value), flagged)
            )
    return out


def regressions(series: Mapping[str, Mapping[str, list[Point]]]) -> list[str]:
    """The regressions of each figure's latest run, as lines."""
    found = []
    for key, figures in series.items():
        for name, points in figures.items():
            last = points[-1]
            if last.regression_vs is not None:
                found.append(
                    f"{key} {name}: {last.value:g} at {last.commit}, more than "
                    f"{TOLERANCE:.0%} worse than the best of the previous {WINDOW} "
                    f"({last.regression_vs:g})"
                )
    return found


def render(series: Mapping[str, Mapping[str, list[Point]]], last: int = 8) -> str:
    lines = []
    for key, figures in series.items():
        lines.append(key)
        for name, points in figures.items():
            shown = " -> ".join(
                f"{p.value:g} ({p.commit}){' REGRESSION' if p.regression_vs is not None else ''}"
                for p in points[-last:]
            )
            lines.append(f"  {name}: {shown}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    show = sub.add_parser("trend", help="print each figure over the runs; exit 1 on a regression")
    show.add_argument("bench", nargs="?", help="only this bench (e.g. operator_scale)")
    show.add_argument("--file", type=Path, help="the history file (default bench/history.jsonl)")
    show.add_argument("--last", type=int, default=8, help="runs shown per figure")
    args = parser.parse_args(argv)
    try:
        series = trend(read(args.file), args.bench)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if not series:
        print("no bench runs recorded" + (f" for {args.bench}" if args.bench else ""))
        return 0
    print(render(series, args.last))
    found = regressions(series)
    for line in found:
        print(f"REGRESSION: {line}")
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
