"""The counters CSV (dcgm-exporter's format): parse it, with errors a user can act on.

A line is `<DCGM field>, <Prometheus type>, <help>`; lines whose first non-blank character is `#`
and blank lines are skipped; fields are trimmed and may be quoted (a help text with commas).
Upstream reads the file with Go's CSV reader and stops at the first bad record; we report every
bad line, each with its 1-based line number, the line and the problem. Pure (standard library
only): the operator uses it to check the ConfigMap a ClusterPolicy names.
"""

from __future__ import annotations

import csv
import difflib
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from gpu_operator.agents.dcgm_exporter import fields

# dcgm-exporter's accepted types; `label` attaches the value as a label instead of a sample.
PROM_TYPES = ("gauge", "counter", "histogram", "summary", "label")
DEFAULT_FILE = "default-counters.csv"
# The counters files dcgm-exporter's image carries under /etc/dcgm-exporter, shipped here too:
# the GPU Operator's DaemonSet names the second one (as upstream's does).
IMAGE_DIR = "/etc/dcgm-exporter"
OPERATOR_DEFAULT_FILE = "dcp-metrics-included.csv"
IMAGE_FILES = (DEFAULT_FILE, OPERATOR_DEFAULT_FILE)
MAX_REPORTED = 5


@dataclass(frozen=True)
class Problem:
    """One bad line: where, what it says, and what is wrong with it."""

    line_no: int
    line: str
    problem: str

    def __str__(self) -> str:
        return f"line {self.line_no}: {self.problem}: {self.line.strip()!r}"


class CsvError(ValueError):
    """The counters text does not parse; `problems` lists every bad line (at least one)."""

    def __init__(self, source: str, problems: Iterable[Problem], summary: str | None = None):
        self.source = source
        self.problems = tuple(problems)
        shown = "; ".join(str(p) for p in self.problems[:MAX_REPORTED])
        more = len(self.problems) - MAX_REPORTED
        if more > 0:
            shown += f"; and {more} more bad line(s)"
        self.detail = summary or shown
        super().__init__(f"{source}: {self.detail}")


@dataclass(frozen=True)
class Counter:
    """One counter line: the DCGM field it reads, its Prometheus type and help text."""

    field: fields.Field
    prom_type: str
    help: str
    line_no: int

    @property
    def name(self) -> str:
        return self.field.name

    @property
    def is_label(self) -> bool:
        return self.prom_type == "label"


@dataclass(frozen=True)
class CounterSet:
    """The counters of one file, in file order (a repeated field keeps its first line)."""

    counters: tuple[Counter, ...]
    source: str = "counters"

    @property
    def metrics(self) -> tuple[Counter, ...]:
        """Readable sample counters in exposition order (DCGM field id, as upstream's template)."""
        readable = [c for c in self.counters if not c.is_label and c.field.supported]
        return tuple(sorted(readable, key=lambda c: (c.field.id, c.name)))

    @property
    def labels(self) -> tuple[Counter, ...]:
        """Readable `label` counters."""
        return tuple(c for c in self.counters if c.is_label and c.field.supported)

    @property
    def unsupported(self) -> tuple[Counter, ...]:
        """Counters naming a DCGM field this exporter cannot read (omitted, with a warning)."""
        return tuple(c for c in self.counters if not c.field.supported)

    def field_names(self) -> frozenset[str]:
        return frozenset(c.name for c in self.counters if c.field.supported)


def _split(line: str) -> list[str]:
    # Spaces around a quoted help text are allowed (Go's reader rejects a space before a quote).
    row = next(csv.reader([line.rstrip()], skipinitialspace=True, strict=True))
    return [cell.strip() for cell in row]


def _unknown_field(name: str) -> str:
    close = difflib.get_close_matches(name, [f.name for f in fields.FIELDS], n=1, cutoff=0.85)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return f"unknown DCGM field {name!r}{hint}"


def _check_row(cells: list[str]) -> tuple[str, str | None]:
    """The problem with a split line, or the field name and type it declares."""
    if len(cells) != 3:
        return "", f"expected 3 comma-separated fields (field, type, help), found {len(cells)}"
    name, prom_type, _ = cells
    if not name:
        return "", "the DCGM field name is empty"
    if fields.by_name(name) is None:
        return "", _unknown_field(name)
    if prom_type not in PROM_TYPES:
        expected = ", ".join(PROM_TYPES[:-1]) + f" or {PROM_TYPES[-1]}"
        return "", f"unknown Prometheus type {prom_type!r} (expected {expected})"
    return name, None


def parse(text: str, source: str = "counters") -> CounterSet:
    """Parse counters text; CsvError lists every bad line, or says there are no counters."""
    counters: list[Counter] = []
    seen: set[str] = set()
    problems: list[Problem] = []
    for line_no, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        try:
            cells = _split(line)
        except csv.Error as err:
            problems.append(Problem(line_no, line, f"malformed CSV ({err})"))
            continue
        name, problem = _check_row(cells)
        if problem is not None:
            problems.append(Problem(line_no, line, problem))
            continue
        if name in seen:
            continue  # upstream exports a repeated counter once too
        seen.add(name)
        field = fields.by_name(name)
        assert field is not None
        counters.append(Counter(field, cells[1], cells[2], line_no))
    if problems:
        raise CsvError(source, problems)
    if not counters:
        raise CsvError(source, (), "no counters: every line is blank or a comment")
    return CounterSet(tuple(counters), source)


def load(path: str | Path) -> CounterSet:
    """Parse the counters file at `path` (CsvError also for a file that cannot be read)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        raise CsvError(str(path), (), f"cannot read the counters file: {reason}") from None
    return parse(text, str(path))


def default_text() -> str:
    """The default counters file shipped with the exporter (the operator's default ConfigMap)."""
    return (
        resources.files("gpu_operator.agents.dcgm_exporter")
        .joinpath(DEFAULT_FILE)
        .read_text(encoding="utf-8")
    )


def default() -> CounterSet:
    return parse(default_text(), DEFAULT_FILE)


def shipped_text(name: str) -> str:
    """One of the image's counters files (IMAGE_FILES), as shipped with the exporter."""
    if name not in IMAGE_FILES:
        raise KeyError(f"{name!r} is not a counters file of the exporter image ({IMAGE_FILES})")
    return (
        resources.files("gpu_operator.agents.dcgm_exporter")
        .joinpath(name)
        .read_text(encoding="utf-8")
    )


def shipped(path: str) -> str | None:
    """The shipped file an image path names (`/etc/dcgm-exporter/<file>`), else None."""
    directory, _, name = path.rpartition("/")
    return name if directory == IMAGE_DIR and name in IMAGE_FILES else None
