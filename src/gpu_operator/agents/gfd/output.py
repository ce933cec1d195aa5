"""Where GFD labels go: stdout, an NFD features.d file, a NodeFeature object or node labels."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from pathlib import Path
from typing import Protocol, TextIO

from gpu_operator.agents.gfd import labels as gfd_labels
from gpu_operator.agents.gfd.labels import Labels


class Sink(Protocol):
    """An output for labels; `remove` takes them away again when the agent exits."""

    async def write(self, labels: Labels) -> None: ...
    async def remove(self) -> None: ...


class StdoutSink:
    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream

    async def write(self, labels: Labels) -> None:
        out = self.stream or sys.stdout
        out.write(gfd_labels.render(labels))
        out.flush()

    async def remove(self) -> None:
        return None


class FileSink:
    """A features.d file, replaced atomically so NFD never reads half a file."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    async def write(self, labels: Labels) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".gfd-", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(gfd_labels.render(labels))
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, 0o644)
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    async def remove(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
