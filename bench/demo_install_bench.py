"""The demo's two install paths, timed: the operator in-process versus `helm install --wait` of
the chart with everything it deploys running (NFD, the operator as a process, its probes).

Run: .venv/bin/python bench/demo_install_bench.py [--fleet default] [--runs 2] [--chart DIR]
Prints, per run and path, the seconds from the start of the install (ClusterPolicy creation
in-process, `helm install` otherwise) to every GPU node converged, and the wall time of the whole
run (cluster start to summary). Asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import statistics
import sys
import time
from pathlib import Path

from rich.console import Console

from gpudemo import fleet, programs, session

sys.path.insert(0, str(Path(__file__).resolve().parent))
import history  # bench/history.py, next to this script: runs append their figures there


async def once(mode: str, fleet_name: str, chart: Path | None) -> tuple[float, float]:
    out = io.StringIO()
    options = session.Options(
        fleet=fleet.NAMED[fleet_name],
        timing=programs.Timing(scale=1.0),
        timeout=180.0,
        live=False,
        install=mode,
        chart=chart,
        progress_interval=3600.0,
    )
    started = time.monotonic()
    result = await session.run(options, Console(file=out, width=200))
    wall = time.monotonic() - started
    if not result.converged or result.summary is None:
        raise SystemExit(f"{mode}: did not converge:\n{out.getvalue()[-2000:]}")
    return result.summary.time_to_ready, wall


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--fleet", default="default")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--chart", type=Path, default=None)
    args = parser.parse_args()
    figures: dict[str, list[tuple[float, float]]] = {"in-process": [], "helm": []}
    for run in range(args.runs):
        for mode in figures:
            ready, wall = await once(mode, args.fleet, args.chart)
            figures[mode].append((ready, wall))
            print(f"run {run + 1} {mode:10}  ready {ready:5.1f}s  wall {wall:5.1f}s", flush=True)
    summary: dict[str, float] = {}
    for mode, values in figures.items():
        ready = statistics.median(v[0] for v in values)
        wall = statistics.median(v[1] for v in values)
        print(f"median {mode:10}  ready {ready:5.1f}s  wall {wall:5.1f}s")
        key = mode.replace("-", "_")
        summary[f"{key}_ready_s"] = ready
        summary[f"{key}_wall_s"] = wall
    history.append("demo_install", summary, config={"fleet": args.fleet, "runs": args.runs})


if __name__ == "__main__":
    asyncio.run(main())
