"""A read-only check of the project's GPU agents on this machine's NVIDIA GPUs, against nvidia-smi.

    scripts/gpu-check [--out DIR] [--budget SECONDS]      # on a node with NVIDIA GPUs
    scripts/gpu-check --mock dgx-a100-mig-mixed           # the same checks on a mock machine
    scripts/gpu-check --mock box.yaml                     # ... or on a machine file

READ-ONLY ON THE GPU. Nothing here changes MIG mode, clocks, power limits, persistence, ECC or
compute mode, resets a GPU, or creates or destroys GPU or compute instances. The only nvidia-smi
calls are listings (`-L`, `--query-gpu=... --format=csv`, `-q`, `mig -lgip/-lgi/-lci`). The agents
only read NVML (Get* calls and event waits); the ones run in this process go through a guard that
refuses NVML's mutating calls, and the MIG manager gets a host that refuses resets and reboots.

What it runs: the `gpu`-marked tests, then each agent once on the real backend, compared with
nvidia-smi: GPU feature discovery's labels, the device plugin's devices and one Allocate over its
gRPC socket, an exporter scrape, the MIG manager's view of profiles and instances, the container
toolkit's CDI spec, and discovery as a non-root user. It prints one table (check, result, detail),
keeps every raw output in an artefact folder it names, and exits 1 when a row is FAIL. With
`--mock PRESET` the mock backend and the simulated nvidia-smi (`simhost.nvidia_smi`)
stand in for the GPUs, so the whole script runs without one. docs/gpu-layer.md ("Checking on a
real GPU") explains the rows and their tolerances.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import datetime as dt
import enum
import importlib.metadata
import importlib.util
import json
import logging
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import traceback
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
sys.path.insert(0, str(SRC))  # a checkout runs without the project installed

from gpu_operator import nvml  # noqa: E402

PASS, FAIL, SKIP = "PASS", "FAIL", "SKIP"
# Five minutes in all, counted from the wrapper's start (set-up included).
DEFAULT_BUDGET = 290.0
NONROOT_UID = 65532  # the user our image runs the agents as (Dockerfile)
DETAIL_SHOWN = 320  # characters of a detail the table shows
# How far an exporter sample may be from nvidia-smi's reading taken right after the scrape.
TEMP_TOLERANCE_C = 3
POWER_TOLERANCE_W = 15.0
POWER_TOLERANCE_FRACTION = 0.10
FB_USED_TOLERANCE_MIB = 64
FB_TOTAL_TOLERANCE_MIB = 4
TOLERANCES = (
    f"within ±{TEMP_TOLERANCE_C} C, ±max({POWER_TOLERANCE_W:g} W, "
    f"{POWER_TOLERANCE_FRACTION:.0%}), FB used ±{FB_USED_TOLERANCE_MIB} MiB, "
    f"FB used+free+reserved = total ±{FB_TOTAL_TOLERANCE_MIB} MiB"
)
QUERY = (
    "index",
    "uuid",
    "name",
    "pci.bus_id",
    "driver_version",
    "memory.total",
    "memory.used",
    "temperature.gpu",
    "power.draw",
    "mig.mode.current",
)
NOT_AVAILABLE = ("[N/A]", "N/A", "[Not Supported]", "[Unknown Error]", "")
# What nvidia-smi prints instead of a MIG table when there is nothing to list.
NOTHING_TO_LIST = ("No MIG-enabled devices found", "No GPU instances found", "No compute instances")
NO_MIG = "no GPU has MIG enabled (nvidia-smi mig.mode.current); this check never enables it"
# NVML calls that change a GPU; the guard refuses them by name on every NVML object.
MUTATING_CALLS = frozenset(
    {"set_mig_mode", "create_gpu_instance", "create_compute_instance", "destroy"}
)


class Skip(Exception):
    """The check cannot run here; the message says why."""


class CheckTimeout(Exception):
    """A check ran past its share of the time budget."""


class ReadOnlyViolation(RuntimeError):
    """Something tried to change a GPU or the host; the check refuses it."""


# ----- parsing nvidia-smi (pure) ----------------------------------------------------------------


@dataclass(frozen=True)
class MigLine:
    """A MIG device in `nvidia-smi -L`."""

    gpu: int
    profile: str
    index: int
    uuid: str


@dataclass(frozen=True)
class Listing:
    """`nvidia-smi -L`: (index, name, UUID) per GPU, and the MIG devices."""

    gpus: tuple[tuple[int, str, str], ...]
    migs: tuple[MigLine, ...]


@dataclass(frozen=True)
class ProfileRow:
    """A row of `nvidia-smi mig -lgip`: GPU, profile name (no `MIG `), NVML id, free/total."""

    gpu: int
    name: str
    profile_id: int
    free: int
    total: int


@dataclass(frozen=True)
class InstanceRow:
    """A row of `mig -lgi` (ci None) or `mig -lci`; placement None where the driver omits it."""

    gpu: int
    gi: int
    ci: int | None
    name: str
    profile_id: int
    placement: tuple[int, int] | None


_LIST_GPU = re.compile(r"^GPU (\d+): (.+?) \(UUID: (GPU-[^)]+)\)")
_LIST_MIG = re.compile(r"^\s+MIG\s+(\S+?)\s*Device\s+(\d+):\s*\(UUID: (MIG-[^)]+)\)")
_LGIP = re.compile(r"^\|\s*(\d+)\s+MIG\s+(\S+)\s+(\d+)\s+(\d+)/(\d+)\s+[\d.]+\s")
_LGI = re.compile(r"^\|\s*(\d+)\s+MIG\s+(\S+)\s+(\d+)\s+(\d+)(?:\s+(\d+):(\d+))?\s*\|")
_LCI = re.compile(r"^\|\s*(\d+)\s+(\d+)\s+MIG\s+(\S+)\s+(\d+)\s+(\d+)(?:\s+(\d+):(\d+))?\s*\|")
_SAMPLE = re.compile(r"^([A-Za-z_:][\w:]*)\{(.*)\} (\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_list(text: str) -> Listing:
    """GPUs and MIG devices from `nvidia-smi -L`."""
    gpus: list[tuple[int, str, str]] = []
    migs: list[MigLine] = []
    for line in text.splitlines():
        if m := _LIST_GPU.match(line):
            gpus.append((int(m[1]), m[2], m[3]))
        elif (m := _LIST_MIG.match(line)) and gpus:
            migs.append(MigLine(gpus[-1][0], m[1], int(m[2]), m[3]))
    return Listing(tuple(gpus), tuple(migs))


def parse_query(text: str, fields: Sequence[str]) -> list[dict[str, str]]:
    """Rows of `--query-gpu=<fields> --format=csv,noheader,nounits`."""
    rows = []
    for line in text.splitlines():
        if not line.strip():
            continue
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(fields):
            raise ValueError(f"nvidia-smi --query-gpu: {len(cells)} values in {line!r}")
        rows.append(dict(zip(fields, cells, strict=True)))
    return rows


def parse_profiles(text: str) -> list[ProfileRow]:
    """`nvidia-smi mig -lgip` (both the older and the wider column layouts)."""
    return [
        ProfileRow(int(m[1]), m[2], int(m[3]), int(m[4]), int(m[5]))
        for m in map(_LGIP.match, text.splitlines())
        if m
    ]


def _placement(start: str | None, size: str | None) -> tuple[int, int] | None:
    return (int(start), int(size)) if start is not None and size is not None else None


def parse_gpu_instances(text: str) -> list[InstanceRow]:
    """`nvidia-smi mig -lgi` (with or without the Placement column of older drivers)."""
    return [
        InstanceRow(int(m[1]), int(m[4]), None, m[2], int(m[3]), _placement(m[5], m[6]))
        for m in map(_LGI.match, text.splitlines())
        if m
    ]


def parse_compute_instances(text: str) -> list[InstanceRow]:
    """`nvidia-smi mig -lci` (with or without the Placement column)."""
    return [
        InstanceRow(int(m[1]), int(m[2]), int(m[5]), m[3], int(m[4]), _placement(m[6], m[7]))
        for m in map(_LCI.match, text.splitlines())
        if m
    ]


@dataclass(frozen=True)
class Sample:
    name: str
    labels: Mapping[str, str]
    value: float


def parse_metrics(text: str) -> list[Sample]:
    """Prometheus text samples that carry labels (comments and bare metrics are skipped)."""
    samples = []
    for line in text.splitlines():
        if m := _SAMPLE.match(line):
            with contextlib.suppress(ValueError):
                samples.append(Sample(m[1], dict(_LABEL.findall(m[2])), float(m[3])))
    return samples


def sanitise(text: str) -> str:
    """A GPU name as GFD writes it into `gpu.product` (upstream's rule)."""
    return "-".join(re.sub(r"[^A-Za-z0-9\-_. ]", "", text).split())


def mig_resource(profile: str) -> str:
    """The resource (and GFD label prefix) of a MIG profile: `nvidia.com/mig-1g.10gb.me`."""
    return "nvidia.com/mig-" + profile.replace("+", ".")


def number(value: str) -> float | None:
    try:
        return float(value)
    except ValueError:
        return None


# ----- running things, boundedly ----------------------------------------------------------------


@dataclass(frozen=True)
class Output:
    """A finished (or failed-to-run) command: exit code None when it did not run to the end."""

    argv: tuple[str, ...]
    code: int | None
    stdout: str
    stderr: str
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.code == 0

    def why(self) -> str:
        """One line saying what went wrong."""
        if self.error:
            return self.error
        lines = (self.stderr.strip() or self.stdout.strip()).splitlines()
        return f"exit {self.code}: {lines[-1] if lines else 'no output'}"


def mock_is_file(value: str) -> bool:
    """Whether --mock names a machine YAML file rather than a preset."""
    return value.endswith((".yaml", ".yml")) or os.sep in value


def child_env(**extra: str) -> dict[str, str]:
    """This environment for the agents: the checkout's src first, no agent settings inherited."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("GFD_", "DCGM_"))
        and k not in ("MIG_STRATEGY", "CONFIG_FILE", "NODE_NAME", "KUBECONFIG")
    }
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")]))
    env.update(extra)
    return env


@dataclass
class Context:
    """What the checks share: where artefacts go, the backend, the deadline, cached listings."""

    out: Path
    mock: str | None
    deadline: float
    budget: float = DEFAULT_BUDGET
    python: str = sys.executable
    host_root: Path = Path("/")
    cache: dict[str, Output] = field(default_factory=dict)
    gfd_labels: dict[str, str] | None = None
    _machine: Any = None

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def limit(self, seconds: float) -> float:
        """`seconds`, or what is left of the budget if that is less."""
        return max(1.0, min(seconds, self.remaining()))

    def log(self, line: str) -> None:
        with (self.out / "commands.log").open("a") as f:
            f.write(line + "\n")

    def run(
        self, argv: Sequence[str], name: str, timeout: float, env: dict[str, str] | None = None
    ) -> Output:
        """Run a command with a deadline, keeping its output as artefacts `<name>` (+ `.err`)."""
        started = time.monotonic()
        limit = self.limit(timeout)
        try:
            proc = subprocess.run(
                list(argv),
                capture_output=True,
                text=True,
                timeout=limit,
                env=env or child_env(),
                cwd=ROOT,
                check=False,
            )
            out = Output(tuple(argv), proc.returncode, proc.stdout, proc.stderr)
        except subprocess.TimeoutExpired as err:
            text = err.stdout.decode() if isinstance(err.stdout, bytes) else err.stdout or ""
            out = Output(tuple(argv), None, text, "", f"timed out after {limit:.0f} s")
        except OSError as err:
            out = Output(tuple(argv), None, "", "", f"{argv[0]}: {err.strerror or err}")
        (self.out / name).write_text(out.stdout)
        if out.stderr:
            (self.out / f"{name}.err").write_text(out.stderr)
        code = out.error or f"exit {out.code}"
        self.log(f"{' '.join(argv)}  -> {code}, {time.monotonic() - started:.1f} s, {name}")
        return out

    # -- nvidia-smi, real or simulated ---------------------------------------------------------

    def smi(self, *args: str, name: str, fresh: bool = False, timeout: float = 30) -> Output:
        """An nvidia-smi listing (the simulated one with --mock), run once unless `fresh`."""
        if not fresh and name in self.cache:
            return self.cache[name]
        if self.mock:
            argv = [self.python, "-m", "simhost.nvidia_smi", *self.machine_options()]
        else:
            argv = ["nvidia-smi"]
        out = self.run([*argv, *args], name, timeout)
        self.cache[name] = out
        return out

    def smi_gpus(self) -> list[dict[str, str]]:
        out = self.smi(f"--query-gpu={','.join(QUERY)}", "--format=csv,noheader,nounits",
                       name="nvidia-smi-query-gpu.csv")  # fmt: skip
        if not out.ok:
            raise Skip(f"no nvidia-smi --query-gpu to compare with ({out.why()})")
        return parse_query(out.stdout, QUERY)

    def smi_list(self) -> Listing:
        out = self.smi("-L", name="nvidia-smi-L.txt")
        if not out.ok:
            raise Skip(f"no nvidia-smi -L to compare with ({out.why()})")
        return parse_list(out.stdout)

    def smi_mig(self, option: str) -> str:
        """The text of `nvidia-smi mig <option>` ('' when there is nothing to list)."""
        out = self.smi("mig", option, name=f"nvidia-smi-mig{option}.txt")
        if out.ok:
            return out.stdout
        if any(s in out.stdout + out.stderr for s in NOTHING_TO_LIST):
            return ""
        raise Skip(f"nvidia-smi mig {option} listed nothing to compare with ({out.why()})")

    def mig_enabled(self) -> set[int]:
        """Indices of the GPUs whose MIG mode is enabled now, as nvidia-smi reports it."""
        return {int(g["index"]) for g in self.smi_gpus() if g["mig.mode.current"] == "Enabled"}

    # -- the agents ----------------------------------------------------------------------------

    def machine_options(self) -> list[str]:
        """`--machine PRESET` or `--machine-file FILE` for the mock machine."""
        assert self.mock is not None
        if mock_is_file(self.mock):
            return ["--machine-file", str(Path(self.mock).resolve())]
        return ["--machine", self.mock]

    def agent(self, name: str, *args: str) -> list[str]:
        """`gpu-operator agent NAME ...` on this run's backend."""
        backend = (
            ["--backend", "mock", *self.machine_options()] if self.mock else ["--backend", "nvml"]
        )
        return [self.python, "-m", "gpu_operator", "agent", name, *args, *backend]

    def open_nvml(self) -> nvml.Nvml:
        """A library handle for in-process agents, behind the read-only guard."""
        if self.mock:
            if self._machine is None:
                from gpu_operator.agents import mock_backend

                file = self.mock if mock_is_file(self.mock) else None
                self._machine = mock_backend.machine(None if file else self.mock, file)
            return cast(nvml.Nvml, ReadOnly(self._machine.nvml()))
        from gpu_operator.nvml import real

        return cast(nvml.Nvml, ReadOnly(real.RealNvml()))


# ----- the read-only guard ----------------------------------------------------------------------


def _backend_object(value: object) -> bool:
    """A library, device, instance or event set of a backend (records and enums are data)."""
    if dataclasses.is_dataclass(value) or isinstance(value, enum.Enum):
        return False
    return type(value).__module__.startswith("gpu_operator.nvml.")


def _unwrap(value: Any) -> Any:
    return value._inner if isinstance(value, ReadOnly) else value


def _wrap(value: Any) -> Any:
    if isinstance(value, list):
        return [_wrap(v) for v in value]
    return ReadOnly(value) if _backend_object(value) else value


class ReadOnly:
    """An NVML library, device or instance that refuses the calls that would change a GPU and
    wraps every backend object it hands out the same way."""

    def __init__(self, inner: object) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        if name in MUTATING_CALLS:
            raise ReadOnlyViolation(f"gpu-check is read-only: refused the NVML call {name}()")
        value = getattr(self._inner, name)
        if not callable(value):
            return value

        def call(*args: Any, **kwargs: Any) -> Any:
            args = tuple(_unwrap(a) for a in args)
            kwargs = {k: _unwrap(v) for k, v in kwargs.items()}
            return _wrap(value(*args, **kwargs))

        return call

    def __eq__(self, other: object) -> bool:
        return bool(self._inner == _unwrap(other))

    def __hash__(self) -> int:
        return hash(self._inner)


class ReadOnlyHost:
    """The MIG manager's host, refusing everything that would act on the node."""

    def _refuse(self, what: str) -> None:
        raise ReadOnlyViolation(f"gpu-check is read-only: refused {what}")

    def reset_gpus(self, gpus: Sequence[object]) -> None:
        self._refuse("a GPU reset")

    def reboot(self) -> None:
        self._refuse("a reboot")

    def stop_services(self, names: Sequence[str]) -> list[str]:
        self._refuse("stopping host services")
        return []

    def start_services(self, names: Sequence[str]) -> None:
        self._refuse("starting host services")

    def persist_selected_config(self, name: str) -> bool:
        self._refuse("persisting a MIG config")
        return False


# ----- the checks: each returns (result, detail) or raises Skip ---------------------------------


def check_setup(ctx: Context) -> tuple[str, str]:
    """The Python environment: how it was set up and whether the agents' modules import."""
    how = os.environ.get("GPU_CHECK_SETUP", f"run directly with {sys.executable}")
    needed = ["grpc", "prometheus_client", "yaml", "typer", "pydantic", "aiohttp"]
    if not ctx.mock:
        needed.append("pynvml")
    missing = [m for m in needed if importlib.util.find_spec(m) is None]
    try:
        pynvml_version = importlib.metadata.version("nvidia-ml-py")
    except importlib.metadata.PackageNotFoundError:
        pynvml_version = "not installed"
    detail = f"{how}; Python {sys.version.split()[0]}; nvidia-ml-py {pynvml_version}"
    if missing:
        return FAIL, f"{detail}; cannot import {', '.join(missing)}"
    return PASS, detail


def _write_environment(ctx: Context) -> None:
    lines = [
        f"uid {os.getuid()} gid {os.getgid()}",
        f"kernel {os.uname().release} on {os.uname().machine}",
        f"python {sys.executable} {sys.version.split()[0]}",
    ]
    if ctx.mock:
        lines.append(f"mock machine {ctx.mock}; simulated host root {ctx.host_root}")
    with contextlib.suppress(OSError):
        lines.append(Path("/proc/driver/nvidia/version").read_text().strip())
    if not ctx.mock and shutil.which("ldconfig"):
        ld = ctx.run(["ldconfig", "-p"], "ldconfig.txt", 10)
        lines += [ln.strip() for ln in ld.stdout.splitlines() if "libnvidia-ml" in ln]
    (ctx.out / "env.txt").write_text("\n".join(lines) + "\n")


def check_nvidia_smi(ctx: Context) -> tuple[str, str]:
    """nvidia-smi lists the GPUs; its listings are kept for the comparisons below."""
    _write_environment(ctx)
    listing = ctx.smi("-L", name="nvidia-smi-L.txt")
    if not listing.ok:
        return FAIL, f"nvidia-smi -L: {listing.why()}"
    if not ctx.mock:
        ctx.smi("-q", name="nvidia-smi-q.txt", timeout=40)  # an artefact for a human
    for option in ("-lgip", "-lgi", "-lci"):
        ctx.smi("mig", option, name=f"nvidia-smi-mig{option}.txt")
    gpus = parse_list(listing.stdout)
    if not gpus.gpus:
        return FAIL, "nvidia-smi -L lists no GPU"
    try:
        rows = ctx.smi_gpus()
    except (Skip, ValueError) as err:
        return FAIL, str(err)
    if len(rows) != len(gpus.gpus):
        return FAIL, f"--query-gpu has {len(rows)} rows, -L {len(gpus.gpus)} GPUs"
    names = Counter(name for _, name, _ in gpus.gpus)
    models = ", ".join(f"{n}x {name}" for name, n in sorted(names.items()))
    driver = rows[0]["driver_version"] if rows else "?"
    mig = ctx.mig_enabled()
    return PASS, (
        f"{len(gpus.gpus)} GPU(s): {models}; driver {driver}; MIG enabled on "
        f"{len(mig)} GPU(s), {len(gpus.migs)} MIG device(s)"
    )


def _gpu_test_files() -> list[str]:
    return sorted(
        str(p.relative_to(ROOT))
        for p in (ROOT / "tests").rglob("test_*.py")
        if "pytest.mark.gpu" in p.read_text(errors="replace")
    )


def check_gpu_tests(ctx: Context) -> tuple[str, str]:
    """`pytest -m gpu`: the project's own real-GPU tests, bounded."""
    if ctx.mock:
        raise Skip("mock run: the gpu-marked tests read real GPUs only (they skip without one)")
    # Keep about a minute and a half for the agents that follow.
    limit = min(120.0, ctx.remaining() - 90)
    if limit < 20:
        raise Skip(f"time budget: {ctx.remaining():.0f} s left, kept for the agent checks")
    files = _gpu_test_files()
    argv = [ctx.python, "-m", "pytest", "-m", "gpu", "-p", "no:cacheprovider", "-o", "addopts=",
            "--strict-markers", "-q", "-rA", *files]  # fmt: skip
    out = ctx.run(argv, "pytest-gpu.txt", limit)
    lines = out.stdout.strip().splitlines()
    summary = lines[-1].strip("= ") if lines else out.why()
    if out.error:
        return FAIL, f"{out.error} ({len(files)} files)"
    if out.code == 5:
        return FAIL, f"no gpu-marked test collected from {len(files)} files"
    if out.code != 0:
        failed = [ln for ln in lines if ln.startswith(("FAILED", "ERROR"))]
        return FAIL, f"{summary}; {'; '.join(failed[:3])}"
    if "skipped" in summary:
        reasons = [ln.split(": ", 1)[-1] for ln in lines if ln.startswith("SKIPPED")]
        return FAIL, f"{summary}, but a real GPU is expected here: {reasons[0] if reasons else ''}"
    return PASS, summary


def _gfd(ctx: Context, prefix: Sequence[str], name: str, env: dict[str, str]) -> Output:
    argv = ctx.agent("gpu-feature-discovery", "--oneshot", "--output", "-", "--no-timestamp",
                     "--mig-strategy", "mixed")  # fmt: skip
    return ctx.run([*prefix, *argv], name, 60, env)


def parse_labels(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def check_gfd(ctx: Context) -> tuple[str, str]:
    """GFD once (mixed strategy): product, count, memory, driver and MIG labels vs nvidia-smi."""
    out = _gfd(ctx, [], "gfd-labels.txt", child_env())
    if not out.ok:
        return FAIL, f"gpu-feature-discovery --oneshot: {out.why()}"
    labels = parse_labels(out.stdout)
    ctx.gfd_labels = labels
    gpus = ctx.smi_gpus()
    listing = ctx.smi_list()
    problems = []
    names = Counter(g["name"] for g in gpus)
    product = labels.get("nvidia.com/gpu.product", "")
    name = {sanitise(n): n for n in names}.get(product)
    if name is None:
        problems.append(f"gpu.product={product!r} is none of nvidia-smi's {sorted(names)}")
    else:
        count = labels.get("nvidia.com/gpu.count")
        if count != str(names[name]):
            problems.append(f"gpu.count={count} but nvidia-smi lists {names[name]}x {name}")
        memory = number(labels.get("nvidia.com/gpu.memory", ""))
        totals = [number(g["memory.total"]) for g in gpus if g["name"] == name]
        if memory is None or not any(t is not None and abs(memory - t) <= 1 for t in totals):
            problems.append(f"gpu.memory={memory} MiB, nvidia-smi memory.total {totals}")
    driver = labels.get("nvidia.com/cuda.driver-version.full")
    if gpus and driver != gpus[0]["driver_version"]:
        problems.append(f"driver {driver} vs nvidia-smi {gpus[0]['driver_version']}")
    capable = str(any(g["mig.mode.current"] not in NOT_AVAILABLE for g in gpus)).lower()
    if labels.get("nvidia.com/mig.capable") != capable:
        problems.append(f"mig.capable={labels.get('nvidia.com/mig.capable')} (expected {capable})")
    want = Counter(mig_resource(m.profile) for m in listing.migs)
    got = {
        key.removesuffix(".count"): int(value)
        for key, value in labels.items()
        if key.startswith("nvidia.com/mig-") and key.endswith(".count")
    }
    if got != dict(want):
        problems.append(f"MIG counts {got} vs nvidia-smi -L {dict(want)}")
    migs = ", ".join(f"{v}x {k.removeprefix('nvidia.com/mig-')}" for k, v in sorted(got.items()))
    summary = (
        f"product={product} count={labels.get('nvidia.com/gpu.count')} "
        f"memory={labels.get('nvidia.com/gpu.memory')} MiB; MIG: {migs or 'none'}"
    )
    if problems:
        return FAIL, "; ".join(problems)
    return PASS, f"{len(labels)} labels match nvidia-smi: {summary}"


@dataclass
class PluginRun:
    """What one in-process plugin start served: per resource its devices and one Allocate."""

    devices: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    allocations: dict[str, dict[str, Any]] = field(default_factory=dict)
    paths: dict[str, tuple[str, ...]] = field(default_factory=dict)
    idle: str | None = None


async def _serve_plugin(ctx: Context, work: Path, timeout: float) -> PluginRun:
    import grpc

    from gpu_operator.agents.device_plugin import manager
    from gpu_operator.agents.device_plugin import settings as dp_settings
    from kubeletapi.deviceplugin.v1beta1 import api_pb2 as pb
    from kubeletapi.deviceplugin.v1beta1 import api_pb2_grpc as pb_grpc

    settings = dp_settings.build(
        None,
        {"mig_strategy": "mixed"},
        kubelet_socket=None,  # serve without registering: there is no kubelet here
        plugin_dir=work,
        cdi_root=work / "cdi",
        driver_root_view=ctx.host_root,
        dev_root_view=ctx.host_root,
        sys_root=ctx.host_root,
        proc_root=ctx.host_root,
    )
    plugin = manager.Manager(settings, ctx.open_nvml)
    stop = asyncio.Event()
    task = asyncio.create_task(plugin.run(stop=stop, install_signals=False))
    result = PluginRun()
    try:
        serving = asyncio.create_task(plugin.state.serving.wait())
        await asyncio.wait({task, serving}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        if not serving.done():
            serving.cancel()
            if task.done():
                task.result()  # the plugin's own error
            raise RuntimeError(f"not serving after {timeout:.0f} s: {plugin.state.last_error}")
        result.idle = plugin.state.idle_reason
        for resource in plugin.state.resources:
            result.paths.update({d.id: d.paths for d in resource.devices})
            address = f"unix://{work / resource.socket_name}"
            async with grpc.aio.insecure_channel(address) as channel:
                stub = pb_grpc.DevicePluginStub(channel)
                stream = stub.ListAndWatch(pb.Empty())
                first = await asyncio.wait_for(stream.read(), 10)
                stream.cancel()
                listed = [(d.ID, d.health) for d in first.devices]
                result.devices[resource.name] = listed
                request = pb.AllocateRequest(
                    container_requests=[pb.ContainerAllocateRequest(devices_ids=[listed[0][0]])]
                )
                response = await asyncio.wait_for(stub.Allocate(request), 10)
                reply = response.container_responses[0]
                result.allocations[resource.name] = {
                    "device": listed[0][0],
                    "envs": dict(reply.envs),
                    "devices": [d.host_path for d in reply.devices],
                    "annotations": dict(reply.annotations),
                }
    finally:
        stop.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 15)
    return result


def check_device_plugin(ctx: Context) -> tuple[str, str]:
    """The device plugin (mixed strategy) in-process over its gRPC socket, without a kubelet:
    its devices vs nvidia-smi -L, MIG resource names vs mig -lgip, one Allocate per resource."""
    gpus = ctx.smi_gpus()
    listing = ctx.smi_list()
    enabled = ctx.mig_enabled()
    profiles = parse_profiles(ctx.smi_mig("-lgip")) if enabled else []
    work = Path(tempfile.mkdtemp(prefix="dp-", dir="/tmp"))  # unix socket paths must be short
    try:
        run = asyncio.run(_serve_plugin(ctx, work, ctx.limit(45)))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    (ctx.out / "device-plugin.json").write_text(
        json.dumps({"devices": run.devices, "allocate": run.allocations}, indent=2) + "\n"
    )
    want: dict[str, set[str]] = {}
    full = {uuid for index, _, uuid in listing.gpus if index not in enabled}
    if full:
        want["nvidia.com/gpu"] = full
    for mig in listing.migs:
        want.setdefault(mig_resource(mig.profile), set()).add(mig.uuid)
    if run.idle and not want:
        return (
            PASS,
            f"nothing to advertise, as in nvidia-smi -L (MIG on, no MIG devices): {run.idle}",
        )
    if run.idle:
        return FAIL, f"the plugin idles ({run.idle}) but nvidia-smi -L lists {len(gpus)} GPU(s)"
    got = {name: {d for d, _ in devices} for name, devices in run.devices.items()}
    problems = []
    for name in sorted(set(want) | set(got)):
        if want.get(name, set()) != got.get(name, set()):
            problems.append(
                f"{name}: plugin {len(got.get(name, ()))} device(s), nvidia-smi -L "
                f"{len(want.get(name, ()))}"
                + (" (IDs differ)" if len(got.get(name, ())) == len(want.get(name, ())) else "")
            )
    offered = {mig_resource(p.name) for p in profiles}
    strange = sorted(n for n in got if n.startswith("nvidia.com/mig-") and n not in offered)
    if strange:
        problems.append(f"MIG resources {strange} are no profile of nvidia-smi mig -lgip")
    sick = [d for devices in run.devices.values() for d, health in devices if health != "Healthy"]
    if sick:
        problems.append(f"not Healthy: {sick[:3]}")
    for name, reply in run.allocations.items():
        visible = reply["envs"].get("NVIDIA_VISIBLE_DEVICES")
        if visible != reply["device"]:
            problems.append(f"Allocate {name}: NVIDIA_VISIBLE_DEVICES={visible!r}")
    missing = sorted(
        {p for paths in run.paths.values() for p in paths}
        - {p for paths in run.paths.values() for p in paths if _on_host(ctx, p).exists()}
    )
    if missing:
        problems.append(f"device nodes missing on the host: {missing[:4]}")
    if problems:
        return FAIL, "; ".join(problems)
    counts = ", ".join(f"{len(d)}x {n}" for n, d in sorted(got.items()))
    return PASS, f"{counts} match nvidia-smi; all Healthy; Allocate gave each resource its device"


def _on_host(ctx: Context, path: str) -> Path:
    return ctx.host_root / path.lstrip("/")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _scrape(url: str, proc: subprocess.Popen[bytes], timeout: float) -> str:
    """/metrics once the first collection is in (or the exporter has exited)."""
    end = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"the exporter exited ({proc.returncode}) before a scrape")
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                text = cast(bytes, response.read()).decode()
            if "DCGM_FI_DEV_GPU_TEMP{" in text:
                return text
            last = "no GPU_TEMP sample yet"
        except (urllib.error.URLError, OSError) as err:
            last = str(err)
        time.sleep(0.2)
    raise RuntimeError(f"no metrics after {timeout:.0f} s ({last})")


def _compare_gpu(gpu: Mapping[str, str], samples: Sequence[Sample], mig: bool) -> list[str]:
    """Exporter samples of one GPU against its nvidia-smi row (the tolerances above)."""
    mine = [s for s in samples if s.labels.get("UUID") == gpu["uuid"]]
    whole = [s for s in mine if "GPU_I_ID" not in s.labels]

    def value(metric: str, among: Sequence[Sample]) -> float | None:
        return next((s.value for s in among if s.name == metric), None)

    problems = []
    index = gpu["index"]
    temp, smi_temp = value("DCGM_FI_DEV_GPU_TEMP", mine), number(gpu["temperature.gpu"])
    if temp is None:
        problems.append(f"GPU {index}: no DCGM_FI_DEV_GPU_TEMP")
    elif smi_temp is not None and abs(temp - smi_temp) > TEMP_TOLERANCE_C:
        problems.append(f"GPU {index}: temperature {temp:g} C vs nvidia-smi {smi_temp:g} C")
    power, smi_power = value("DCGM_FI_DEV_POWER_USAGE", mine), number(gpu["power.draw"])
    if smi_power is not None:
        allowed = max(POWER_TOLERANCE_W, POWER_TOLERANCE_FRACTION * smi_power)
        if power is None:
            problems.append(f"GPU {index}: no DCGM_FI_DEV_POWER_USAGE")
        elif abs(power - smi_power) > allowed:
            problems.append(f"GPU {index}: power {power:.1f} W vs nvidia-smi {smi_power:.1f} W")
    if mig:
        return problems  # framebuffer samples are per MIG instance: no whole-GPU figure to compare
    used, smi_used = value("DCGM_FI_DEV_FB_USED", whole), number(gpu["memory.used"])
    free, reserved = value("DCGM_FI_DEV_FB_FREE", whole), value("DCGM_FI_DEV_FB_RESERVED", whole)
    total = number(gpu["memory.total"])
    if used is None or free is None:
        problems.append(f"GPU {index}: no DCGM_FI_DEV_FB_USED/FB_FREE")
        return problems
    if smi_used is not None and abs(used - smi_used) > FB_USED_TOLERANCE_MIB:
        problems.append(f"GPU {index}: FB used {used:g} MiB vs nvidia-smi {smi_used:g} MiB")
    whole_fb = used + free + (reserved or 0)
    if total is not None and abs(whole_fb - total) > FB_TOTAL_TOLERANCE_MIB:
        problems.append(
            f"GPU {index}: FB used+free+reserved {whole_fb:g} MiB vs memory.total {total:g} MiB"
        )
    return problems


def check_exporter(ctx: Context) -> tuple[str, str]:
    """The exporter once (its HTTP endpoint on 127.0.0.1): temperature, power and framebuffer
    per GPU vs `nvidia-smi --query-gpu` read right after the scrape."""
    port = _free_port()
    argv = ctx.agent("dcgm-exporter", "-a", f"127.0.0.1:{port}", "-c", "1000")
    ctx.log(" ".join(argv))
    with (ctx.out / "exporter.log").open("wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=child_env(),
                                cwd=ROOT)  # fmt: skip
        try:
            text = _scrape(f"http://127.0.0.1:{port}/metrics", proc, ctx.limit(30))
            fresh = ctx.smi(f"--query-gpu={','.join(QUERY)}", "--format=csv,noheader,nounits",
                            name="nvidia-smi-query-gpu-at-scrape.csv", fresh=True)  # fmt: skip
        except RuntimeError as err:
            logged = (ctx.out / "exporter.log").read_text(errors="replace").strip().splitlines()
            return FAIL, f"{err}: {logged[-1] if logged else 'nothing logged'}"
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
    (ctx.out / "metrics.txt").write_text(text)
    if not fresh.ok:
        raise Skip(f"no nvidia-smi --query-gpu to compare with ({fresh.why()})")
    gpus = parse_query(fresh.stdout, QUERY)
    samples = parse_metrics(text)
    enabled = ctx.mig_enabled()
    problems = [p for g in gpus for p in _compare_gpu(g, samples, int(g["index"]) in enabled)]
    compared = (
        "temperature, power and framebuffer"
        if len(enabled) < len(gpus)
        else ("temperature and power")
    )
    what = f"{len(gpus)} GPU(s), {len(samples)} samples"
    if enabled:
        what += f"; framebuffer is per MIG instance on the {len(enabled)} MIG GPU(s), not compared"
    if problems:
        return FAIL, f"{'; '.join(problems)} ({what}; {TOLERANCES})"
    return PASS, f"{compared} agree with nvidia-smi: {what} ({TOLERANCES})"


def _mig_manager() -> Any:
    from gpu_operator.agents.mig_manager import gpus

    return gpus


def _differences(ours: set[Any], theirs: set[Any], label: str) -> str:
    only_ours = sorted(ours - theirs)[:4]
    only_theirs = sorted(theirs - ours)[:4]
    return f"only ours: {only_ours}; only nvidia-smi {label}: {only_theirs}"


def check_mig_profiles(ctx: Context) -> tuple[str, str]:
    """The MIG manager's GPU-instance profiles (named by our rule) vs `nvidia-smi mig -lgip`."""
    enabled = ctx.mig_enabled()
    if not enabled:
        raise Skip(NO_MIG)
    rows = parse_profiles(ctx.smi_mig("-lgip"))
    found = _mig_manager().Gpus(ctx.open_nvml, ReadOnlyHost()).profiles()
    ours = {(g.index, p.name, p.instance_count) for g in found if g.index in enabled
            for p in g.profiles}  # fmt: skip
    theirs = {(r.gpu, r.name, r.total) for r in rows}
    if ours != theirs:
        return FAIL, _differences(ours, theirs, "-lgip")
    names = sorted({name for _, name, _ in ours})
    return PASS, f"{len(names)} profiles on {len(enabled)} GPU(s) match: {' '.join(names)}"


def _mig_states(ctx: Context, enabled: set[int]) -> list[Any]:
    states = _mig_manager().Gpus(ctx.open_nvml, ReadOnlyHost()).read()
    return [s for s in states if s.index in enabled]


def check_mig_gpu_instances(ctx: Context) -> tuple[str, str]:
    """The MIG manager's reading of the GPU instances (profile, id, placement) vs `mig -lgi`."""
    enabled = ctx.mig_enabled()
    if not enabled:
        raise Skip(NO_MIG)
    rows = parse_gpu_instances(ctx.smi_mig("-lgi"))
    with_placement = all(r.placement is not None for r in rows)
    ours = {
        (s.index, gi.id, gi.profile.name,
         (gi.placement.start, gi.placement.size) if with_placement else None)
        for s in _mig_states(ctx, enabled)
        for gi in s.instances
    }  # fmt: skip
    theirs = {(r.gpu, r.gi, r.name, r.placement) for r in rows}
    if not ours and not theirs:
        raise Skip("MIG is enabled but no GPU instance exists (this check never creates one)")
    if ours != theirs:
        return FAIL, _differences(ours, theirs, "-lgi")
    shown = Counter(name for _, _, name, _ in ours)
    return PASS, f"{len(ours)} GPU instances match: " + ", ".join(
        f"{n}x {name}" for name, n in sorted(shown.items())
    )


def check_mig_compute_instances(ctx: Context) -> tuple[str, str]:
    """The compute instances the MIG manager reads (GI id, CI id, placement) vs `mig -lci`."""
    enabled = ctx.mig_enabled()
    if not enabled:
        raise Skip(NO_MIG)
    rows = parse_compute_instances(ctx.smi_mig("-lci"))
    with_placement = all(r.placement is not None for r in rows)
    ours = {
        (s.index, gi.id, ci.id,
         (ci.placement.start, ci.placement.size) if with_placement else None)
        for s in _mig_states(ctx, enabled)
        for gi in s.instances
        for ci in gi.compute
    }  # fmt: skip
    theirs = {(r.gpu, r.gi, r.ci, r.placement) for r in rows}
    if not ours and not theirs:
        raise Skip("MIG is enabled but no compute instance exists (this check never creates one)")
    if ours != theirs:
        return FAIL, _differences(ours, theirs, "-lci")
    return PASS, f"{len(ours)} compute instances on {len(enabled)} GPU(s) match"


def check_cdi(ctx: Context) -> tuple[str, str]:
    """The container toolkit's CDI spec for this host: every device node and library it names
    exists, libcuda and libnvidia-ml are mounted, and every GPU and MIG device has an entry."""
    from gpu_operator.agents import cdi
    from gpu_operator.agents.container_toolkit import cdi_spec

    root = ctx.host_root
    path, spec = cdi_spec.generate(
        ctx.open_nvml,
        ctx.out / "cdi",
        kind=cdi_spec.MANAGEMENT_KIND,
        driver_root=str(root),
        driver_root_view=root,
        dev_root=str(root),
        dev_root_view=root,
        hook_path="/usr/bin/nvidia-cdi-hook",
        sys_root=root,
    )
    common = spec["containerEdits"]
    nodes = [n["hostPath"] for d in spec["devices"] for n in d["containerEdits"]["deviceNodes"]]
    nodes += [n["hostPath"] for n in common.get("deviceNodes", [])]
    mounts = [m["hostPath"] for m in common.get("mounts", [])]
    libraries = sorted({Path(m).name.split(".so")[0] for m in mounts if ".so" in m})
    problems = []
    absent = sorted({p for p in nodes + mounts if not Path(p).exists()})
    if absent:
        problems.append(f"not on the host: {absent[:4]}")
    for needed in ("libcuda", "libnvidia-ml"):
        if needed not in libraries:
            problems.append(f"{needed}.so is not mounted")
    host_gpucomp = [p for d in cdi.LIBRARY_DIRS for p in (root / d).glob("libnvidia-gpucomp.so.*")]
    if host_gpucomp and "libnvidia-gpucomp" not in libraries:
        problems.append(f"{host_gpucomp[0].name} is on the host but not mounted (PTX JIT needs it)")
    names = {d["name"] for d in spec["devices"]}
    listing = ctx.smi_list()
    unnamed = [u for u in [g[2] for g in listing.gpus] + [m.uuid for m in listing.migs]
               if u not in names]  # fmt: skip
    if unnamed:
        problems.append(f"no entry for {unnamed[:3]}")
    if problems:
        return FAIL, "; ".join(problems)
    return PASS, (
        f"{path.name}: {len(names)} entries, {len(set(nodes))} device nodes, {len(mounts)} "
        f"mounts ({', '.join(libraries)}), all present on the host"
    )


def _as_nonroot() -> list[str] | None:
    """The command prefix that runs a program as NONROOT_UID, None if there is none."""
    if shutil.which("setpriv"):
        return ["setpriv", f"--reuid={NONROOT_UID}", f"--regid={NONROOT_UID}", "--clear-groups",
                "--"]  # fmt: skip
    if shutil.which("runuser"):
        with contextlib.suppress(KeyError):
            return ["runuser", "-u", pwd.getpwuid(NONROOT_UID).pw_name, "--"]
    return None


def check_nonroot(ctx: Context) -> tuple[str, str]:
    """GFD once more as uid 65532 (the user our image runs the agents as): the same labels."""
    if os.geteuid() != 0:
        raise Skip(f"not root: every row above already ran as uid {os.geteuid()}")
    prefix = _as_nonroot()
    if prefix is None:
        raise Skip(f"neither setpriv nor runuser (with a user for uid {NONROOT_UID}) is here")
    env = child_env(HOME="/tmp", PYTHONDONTWRITEBYTECODE="1")
    probe = ctx.run([*prefix, ctx.python, "-c", "import gpu_operator.agents.gfd.command"],
                    "nonroot-import.txt", 30, env)  # fmt: skip
    if not probe.ok:
        raise Skip(f"uid {NONROOT_UID} cannot load the project from this checkout: {probe.why()}")
    out = _gfd(ctx, prefix, "gfd-labels-nonroot.txt", env)
    if not out.ok:
        return FAIL, f"GFD as uid {NONROOT_UID}: {out.why()}"
    labels = parse_labels(out.stdout)
    if ctx.gfd_labels is None:
        raise Skip(f"GFD as uid {NONROOT_UID} gave {len(labels)} labels; the root run failed, "
                   "so there is nothing to compare them with")  # fmt: skip
    differ = sorted(
        k for k in set(labels) | set(ctx.gfd_labels) if labels.get(k) != ctx.gfd_labels.get(k)
    )
    if differ:
        shown = [f"{k}: {ctx.gfd_labels.get(k)!r} as root, {labels.get(k)!r}" for k in differ[:3]]
        return FAIL, f"{len(differ)} label(s) differ as uid {NONROOT_UID}: {'; '.join(shown)}"
    return PASS, f"GFD as uid {NONROOT_UID} ({prefix[0]}): the same {len(labels)} labels as root"


Check = Callable[[Context], tuple[str, str]]
# (row name, check, longest it may take in seconds)
CHECKS: tuple[tuple[str, Check, float], ...] = (
    ("setup", check_setup, 10),
    ("nvidia-smi listings", check_nvidia_smi, 90),
    ("pytest -m gpu", check_gpu_tests, 130),
    ("GFD labels", check_gfd, 70),
    ("device plugin + Allocate", check_device_plugin, 70),
    ("exporter scrape", check_exporter, 60),
    ("MIG profiles (-lgip)", check_mig_profiles, 30),
    ("MIG GPU instances (-lgi)", check_mig_gpu_instances, 30),
    ("MIG compute instances (-lci)", check_mig_compute_instances, 30),
    ("CDI spec", check_cdi, 30),
    ("non-root discovery", check_nonroot, 70),
)


# ----- running the checks and the table ---------------------------------------------------------


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise CheckTimeout in this (main) thread after `seconds`."""

    def expire(signum: int, frame: object) -> None:
        raise CheckTimeout(f"gave up after {seconds:.0f} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def build_mock_host(ctx: Context) -> Path:
    """A simulated host root for --mock: the simulated driver's files, the device nodes the
    NVIDIA driver creates for the mock GPUs, and its MIG capability minors."""
    from gpu_operator.agents.device_plugin import facts
    from simhost import driver as driver_demo

    root = ctx.out / "mock-host"
    lib = ctx.open_nvml()
    lib.init()
    try:
        driver_demo.write_driver_files(root, lib.driver_version())
        nodes = ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset"]
        minors: list[int] = []
        caps = ["config", "monitor"]
        for index in range(lib.device_count()):
            gpu = lib.device_by_index(index)
            minor = gpu.minor_number()
            minors.append(minor)
            nodes.append(f"nvidia{minor}")
            try:
                count = gpu.max_mig_device_count() if gpu.mig_mode().current else 0
            except nvml.NvmlError:
                count = 0
            for j in range(count):
                with contextlib.suppress(nvml.NotFound, nvml.InvalidArgument):
                    mig = gpu.mig_device_by_index(j)
                    gi, ci = mig.gpu_instance_id(), mig.compute_instance_id()
                    caps += [f"gpu{minor}/gi{gi}/access", f"gpu{minor}/gi{gi}/ci{ci}/access"]
    finally:
        lib.shutdown()
    table = facts.standard_mig_minors(tuple(minors))
    minors_file = root / facts.MIG_MINORS_FILE
    minors_file.parent.mkdir(parents=True, exist_ok=True)
    minors_file.write_text("".join(f"{k} {v}\n" for k, v in table.items()))
    nodes += [f"nvidia-caps/nvidia-cap{table[key]}" for key in dict.fromkeys(caps)]
    for node in nodes:
        (root / "dev" / node).parent.mkdir(parents=True, exist_ok=True)
        (root / "dev" / node).touch()
    return root


@dataclass(frozen=True)
class Row:
    check: str
    result: str
    detail: str
    seconds: float


def run_checks(ctx: Context) -> list[Row]:
    rows = []
    for name, check, longest in CHECKS:
        started = time.monotonic()
        if ctx.remaining() < 3:
            spent = f"the time budget ({ctx.budget:.0f} s in all) was spent before this check"
            rows.append(Row(name, SKIP, spent, 0))
            continue
        try:
            with time_limit(ctx.limit(longest) + 5):
                result, detail = check(ctx)
        except Skip as why:
            result, detail = SKIP, str(why)
        except Exception as err:  # a check reports, it never ends the run
            result, detail = FAIL, f"{type(err).__name__}: {err}"
            with (ctx.out / "errors.txt").open("a") as f:
                f.write(f"== {name}\n{traceback.format_exc()}\n")
        rows.append(Row(name, result, " ".join(detail.split()), time.monotonic() - started))
        if sys.stderr.isatty():  # progress for a person watching; the table comes at the end
            print(f"  {name}: {result} ({rows[-1].seconds:.1f} s)", file=sys.stderr, flush=True)
    return rows


def format_table(rows: Sequence[Row], width: int) -> str:
    """CHECK / RESULT / DETAIL, details wrapped under their column (long ones shortened: the
    whole text is in results.json)."""
    first = max(len("CHECK"), *(len(r.check) for r in rows)) + 2
    indent = first + 8
    lines = [f"{'CHECK':<{first}}{'RESULT':<8}DETAIL"]
    for r in rows:
        detail = textwrap.shorten(r.detail, DETAIL_SHOWN, placeholder=" ... (results.json)")
        wrapped = textwrap.wrap(detail, max(40, width - indent)) or [""]
        lines.append(f"{r.check:<{first}}{r.result:<8}{wrapped[0]}")
        lines += [" " * indent + more for more in wrapped[1:]]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Read-only check of the agents on this machine's NVIDIA GPUs against "
        "nvidia-smi (docs/gpu-layer.md, 'Checking on a real GPU')."
    )
    parser.add_argument(
        "--mock", metavar="PRESET|FILE", help="check a mock machine (a preset or a machine YAML)"
    )
    parser.add_argument("--out", type=Path, help="artefact folder (default: a new one in /tmp)")
    parser.add_argument(
        "--budget", type=float, default=DEFAULT_BUDGET, help="seconds in all (default 290)"
    )
    args = parser.parse_args(argv)
    if args.mock:
        from gpu_operator.agents import mock_backend

        file = args.mock if mock_is_file(args.mock) else None
        try:
            mock_backend.machine(None if file else args.mock, file)
        except mock_backend.MachineChoiceError as err:
            parser.error(f"--mock: {err}")
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    out = args.out or Path(tempfile.mkdtemp(prefix=f"gpu-check-{stamp}-"))
    out.mkdir(parents=True, exist_ok=True)
    started = float(os.environ.get("GPU_CHECK_STARTED") or time.time())
    deadline = time.monotonic() + args.budget - max(0.0, time.time() - started)
    ctx = Context(out=out, mock=args.mock, deadline=deadline, budget=args.budget)
    # The in-process agents log into the artefacts, not over the table.
    logging.basicConfig(
        filename=out / "agents.log",
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    what = (
        f"mock machine {args.mock}" if args.mock else f"the NVIDIA GPUs of {socket.gethostname()}"
    )
    print(f"gpu-check (read-only): {what}; artefacts in {out}", flush=True)
    if args.mock:
        ctx.host_root = build_mock_host(ctx)
    began = time.monotonic()
    rows = run_checks(ctx)
    table = format_table(rows, shutil.get_terminal_size((120, 24)).columns)
    counts = Counter(r.result for r in rows)
    footer = (
        f"{counts[PASS]} PASS, {counts[FAIL]} FAIL, {counts[SKIP]} SKIP in "
        f"{time.monotonic() - began:.0f} s; artefacts in {out}"
    )
    print(table + footer)
    (out / "table.txt").write_text(table + footer + "\n")
    (out / "results.json").write_text(
        json.dumps([r.__dict__ for r in rows], indent=2, ensure_ascii=False) + "\n"
    )
    return 1 if counts[FAIL] else 0


if __name__ == "__main__":
    sys.exit(main())
