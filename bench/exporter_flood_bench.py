"""The metrics exporter under a connection flood: memory and connections held, scrape latency.

Run: .venv/bin/python bench/exporter_flood_bench.py [--connections 5000] [--trickle 200]

The exporter runs as its own process (`python -m gpu_operator.agents.dcgm_exporter --backend
mock`) on an 8-GPU mock node. After a warm-up, a flood opens `--connections` TCP connections as
fast as it can and never sends a byte on them, while `--trickle` slowloris connections send a
request head one byte every `--trickle-every` seconds (reconnecting whenever the exporter cuts
them). A scraper keeps scraping `/metrics` over one keep-alive connection throughout, as
Prometheus does. After `--flood-seconds` the flood stops opening and trickling but holds every
socket it still has open: the exporter has to reclaim them itself (cap and timeouts).

Prints, per flood (`--rounds`, one after the other: memory that grows round after round would be
a leak, memory that stays level is the allocator keeping what it once used), the exporter's RSS
before, at its peak and after the reclaim, the most sockets it had open at once, how long the
reclaim took, and scrape latency and failures during the flood. Figures only; nothing is
asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
import history  # bench/history.py, next to this script: runs append their figures there


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def memory(pid: int) -> dict[str, int]:
    """VmRSS, VmHWM (peak RSS) and RssAnon of a process, in bytes."""
    sizes = {"VmRSS": 0, "VmHWM": 0, "RssAnon": 0}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key = line.split(":", 1)[0]
        if key in sizes:
            sizes[key] = int(line.split()[1]) * 1024
    return sizes


def sockets_held(pid: int) -> int:
    """How many sockets the process has open (the listener and the scraper's included)."""
    count = 0
    for fd in os.scandir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            if os.readlink(fd.path).startswith("socket:"):
                count += 1
    return count


def mib(n: float) -> str:
    return f"{n / 2**20:.1f} MiB"


@dataclass
class Flood:
    """The attacker's side: idle connections held open and slowloris trickles."""

    port: int
    held: list[asyncio.StreamWriter] = field(default_factory=list)
    refused: int = 0
    trickle_cut: int = 0
    trickling: bool = True

    async def open_idle(self, count: int, batch: int = 250) -> None:
        async def one() -> None:
            try:
                _, writer = await asyncio.wait_for(
                    asyncio.open_connection("127.0.0.1", self.port), 10
                )
            except (OSError, TimeoutError):
                self.refused += 1
                return
            self.held.append(writer)

        for start in range(0, count, batch):
            await asyncio.gather(*(one() for _ in range(min(batch, count - start))))

    async def trickle(self, every: float) -> None:
        """One slowloris connection: a head that never ends, a byte at a time."""
        while self.trickling:
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
            except OSError:
                await asyncio.sleep(every)
                continue
            self.held.append(writer)
            try:
                writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ")
                while self.trickling:
                    await writer.drain()
                    if reader.at_eof():
                        break
                    with contextlib.suppress(TimeoutError):
                        # Returns early when the exporter closes the connection.
                        await asyncio.wait_for(reader.read(1), every)
                        break
                    writer.write(b"a")
            except OSError:
                pass
            writer.close()
            self.held.remove(writer)
            if self.trickling:
                self.trickle_cut += 1

    def close(self) -> None:
        for writer in self.held:
            writer.close()
        self.held.clear()


@dataclass
class Scraper:
    url: str
    latencies: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    failed_at: list[int] = field(default_factory=list)  # which scrapes (1 is the first)

    async def run(self, stop: asyncio.Event, every: float = 0.2) -> None:
        timeout = aiohttp.ClientTimeout(total=10)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            while not stop.is_set():
                start = time.perf_counter()
                try:
                    async with http.get(self.url) as resp:
                        await resp.read()
                        if resp.status != 200:
                            self.failures.append(f"HTTP {resp.status}")
                        else:
                            self.latencies.append((time.perf_counter() - start) * 1000)
                except (aiohttp.ClientError, TimeoutError) as err:
                    self.failures.append(type(err).__name__)
                    self.failed_at.append(len(self.latencies) + len(self.failures))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), every)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))] if ordered else float("nan")


@dataclass
class Round:
    """What one flood did to the exporter."""

    before: dict[str, int]
    peak_rss: int
    peak_sockets: int
    opened_in: float
    refused: int
    trickle_cut: int
    reclaimed_in: float | None
    left: int
    after: dict[str, int]
    after_close: dict[str, int]
    during: Scraper
    reclaiming: Scraper


async def flood_once(pid: int, port: int, args: argparse.Namespace) -> Round:
    url = f"http://127.0.0.1:{port}/metrics"
    await asyncio.sleep(1)
    before = memory(pid)
    base_sockets = sockets_held(pid)
    flood = Flood(port)
    try:
        stop_scraping = asyncio.Event()
        during = Scraper(url)
        scraping = asyncio.create_task(during.run(stop_scraping))
        peak_sockets = 0
        peak_rss = 0

        async def sample(until: asyncio.Event) -> None:
            nonlocal peak_sockets, peak_rss
            while not until.is_set():
                peak_rss = max(peak_rss, memory(pid)["VmRSS"])
                peak_sockets = max(peak_sockets, sockets_held(pid))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(until.wait(), 0.1)

        flood_over = asyncio.Event()
        sampling = asyncio.create_task(sample(flood_over))
        started = time.monotonic()
        trickles = [asyncio.create_task(flood.trickle(args.trickle_every))
                    for _ in range(args.trickle)]  # fmt: skip
        await flood.open_idle(args.connections)
        opened_in = time.monotonic() - started
        await asyncio.sleep(max(0.0, args.flood_seconds - (time.monotonic() - started)))
        flood.trickling = False
        await asyncio.gather(*trickles)
        flood_over.set()
        await sampling
        stop_scraping.set()
        await scraping

        # The flood is over but holds its sockets: wait for the exporter to close them.
        ended = time.monotonic()
        reclaiming = Scraper(url)
        reclaim_done = asyncio.Event()
        after_scraping = asyncio.create_task(reclaiming.run(reclaim_done, every=1.0))
        reclaimed_in: float | None = None
        while time.monotonic() - ended < args.reclaim_timeout:
            # The exporter's own sockets plus the scraper's one connection.
            if sockets_held(pid) <= base_sockets + 1:
                reclaimed_in = time.monotonic() - ended
                break
            await asyncio.sleep(0.5)
        left = sockets_held(pid) - base_sockets
        reclaim_done.set()
        await after_scraping
        await asyncio.sleep(1)
        after = memory(pid)
    finally:
        flood.trickling = False
        flood.close()
    await asyncio.sleep(1)
    return Round(
        before, peak_rss, peak_sockets - base_sockets, opened_in, flood.refused,
        flood.trickle_cut, reclaimed_in, left, after, memory(pid), during, reclaiming,
    )  # fmt: skip


def report(n: int, r: Round, args: argparse.Namespace) -> None:
    print(
        f"flood {n}: {args.connections} idle connections (opened in {r.opened_in:.1f} s, "
        f"{r.refused} not connected) + {args.trickle} slowloris trickles "
        f"(a byte every {args.trickle_every:g} s) for {args.flood_seconds:g} s"
    )
    print(f"  exporter RSS before: {mib(r.before['VmRSS'])} (RssAnon {mib(r.before['RssAnon'])})")
    print(f"  exporter RSS peak:   {mib(r.peak_rss)} (sampled every 0.1 s)")
    print(f"  sockets open at most: {r.peak_sockets} (besides its own and the scraper's)")
    print(f"  trickles cut by the exporter: {r.trickle_cut}")
    if r.reclaimed_in is None:
        print(f"  after the flood: {r.left} connections still held after "
              f"{args.reclaim_timeout:g} s")  # fmt: skip
    else:
        print(f"  after the flood: every connection closed by the exporter in "
              f"{r.reclaimed_in:.1f} s")  # fmt: skip
    over = r.after["VmRSS"] - r.before["VmRSS"]
    print(f"  exporter RSS after reclaim: {mib(r.after['VmRSS'])} "
          f"(RssAnon {mib(r.after['RssAnon'])}), {mib(over)} over this round's start")  # fmt: skip
    print(f"  exporter RSS once the flood's client closed its sockets: "
          f"{mib(r.after_close['VmRSS'])}")  # fmt: skip
    lat = r.during.latencies
    if lat:
        print(
            f"  scrapes during the flood: {len(lat)} ok, {len(r.during.failures)} failed; latency "
            f"p50 {statistics.median(lat):.2f} ms, p99 {percentile(lat, 0.99):.2f} ms, "
            f"max {max(lat):.2f} ms"
        )
    else:
        print(f"  scrapes during the flood: none succeeded ({len(r.during.failures)} failed)")
    if r.during.failures:
        kinds = sorted(set(r.during.failures))
        counts = ", ".join(f"{k} x{r.during.failures.count(k)}" for k in kinds)
        which = ", ".join(f"#{n}" for n in r.during.failed_at[:10])
        print(f"    failures: {counts} (scrapes {which})")
    print(f"  scrapes while reclaiming: {len(r.reclaiming.latencies)} ok, "
          f"{len(r.reclaiming.failures)} failed")  # fmt: skip


async def run(args: argparse.Namespace) -> None:
    port = free_port()
    command = [sys.executable, "-m", "gpu_operator.agents.dcgm_exporter"]
    proc = await asyncio.create_subprocess_exec(
        *command, "--backend", "mock", "--machine", args.machine, "-a", f"127.0.0.1:{port}",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        async with aiohttp.ClientSession() as http:
            for _ in range(400):  # the port opens after the first collection
                with contextlib.suppress(aiohttp.ClientConnectorError):
                    async with http.get(url) as resp:
                        await resp.read()
                    break
                await asyncio.sleep(0.05)
            for _ in range(200):  # warm-up: the scrape path's memory is in the baseline
                async with http.get(url) as resp:
                    await resp.read()
        first = None
        for n in range(1, args.rounds + 1):
            r = await flood_once(proc.pid, port, args)
            first = first or r.before
            report(n, r, args)
        peak = memory(proc.pid)["VmHWM"]
        last = memory(proc.pid)
    finally:
        proc.terminate()
        await proc.wait()
    if first is not None:
        print(
            f"exporter RSS: {mib(first['VmRSS'])} before the first flood, {mib(last['VmRSS'])} "
            f"after the last; peak (VmHWM) {mib(peak)}"
        )
        figures = {
            "rss_before_mib": first["VmRSS"] / 2**20,
            "rss_after_mib": last["VmRSS"] / 2**20,
            "rss_peak_mib": peak / 2**20,
        }
        config = {"connections": args.connections, "rounds": args.rounds,
                  "flood_seconds": args.flood_seconds}  # fmt: skip
        history.append("exporter_flood", figures, config=config)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--connections", type=int, default=5000)
    parser.add_argument("--trickle", type=int, default=200)
    parser.add_argument("--trickle-every", type=float, default=2.0)
    parser.add_argument("--flood-seconds", type=float, default=20.0)
    parser.add_argument("--reclaim-timeout", type=float, default=180.0)
    parser.add_argument("--rounds", type=int, default=2, help="floods, one after the other")
    parser.add_argument("--machine", default="dgx-a100")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
