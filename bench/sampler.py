"""A small statistical profiler for a bench's own process (py-spy is not installed here).

Every `interval` seconds of this process's CPU time (ITIMER_PROF) a signal handler looks at the
main thread's Python stack and counts, per function, the samples in which it was running (self)
and those in which it was on the stack (cumulative). Far cheaper than cProfile, whose per-call
cost would change what an event loop with millions of small calls spends its time on.

    with Sampler() as sampler:
        ...
    print(sampler.report(30))
"""

from __future__ import annotations

import signal
from collections import Counter
from types import FrameType, TracebackType

Where = tuple[str, int, str]  # (file, first line, function)


def _where(frame: FrameType) -> Where:
    code = frame.f_code
    return (code.co_filename, code.co_firstlineno, code.co_name)


class Sampler:
    """Samples the main thread's stack on CPU-time ticks; `report` ranks functions."""

    def __init__(self, interval: float = 0.002) -> None:
        self.interval = interval
        self.samples = 0
        self.own: Counter[Where] = Counter()
        self.total: Counter[Where] = Counter()

    def _tick(self, signum: int, frame: FrameType | None) -> None:
        if frame is None:
            return
        self.samples += 1
        self.own[_where(frame)] += 1
        seen: set[Where] = set()
        while frame is not None:
            seen.add(_where(frame))
            frame = frame.f_back
        self.total.update(seen)

    def start(self) -> None:
        signal.signal(signal.SIGPROF, self._tick)
        signal.setitimer(signal.ITIMER_PROF, self.interval, self.interval)

    def stop(self) -> None:
        """Stop sampling (again: nothing); a tick still pending is ignored, not fatal."""
        signal.setitimer(signal.ITIMER_PROF, 0, 0)
        signal.signal(signal.SIGPROF, signal.SIG_IGN)

    def __enter__(self) -> Sampler:
        self.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        err: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.stop()

    def report(self, top: int = 30, root: str = "") -> str:
        """The `top` functions by own and by cumulative samples, as shares of all samples (CPU
        seconds = share x the process's CPU time); `root` is cut from file names."""
        if not self.samples:
            return "no samples"

        def name(where: Where) -> str:
            file, line, function = where
            return f"{file.removeprefix(root)}:{line}({function})"

        lines = [f"{self.samples} samples, one per {self.interval * 1000:.0f} ms of CPU"]
        for title, counts in (("own", self.own), ("cumulative", self.total)):
            lines.append(f"-- by {title} samples --")
            for where, n in counts.most_common(top):
                lines.append(f"{n / self.samples * 100:6.1f}%  {n:7d}  {name(where)}")
        return "\n".join(lines)
