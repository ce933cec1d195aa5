"""NVIDIA's entry-point names for our node agents, so an operand section can point at our image.

The operand renderers start NVIDIA's programs by name (`nvidia-validator`, `gpu-feature-discovery`,
`exec nvidia-device-plugin` in an entrypoint script, ...). The operator image carries one small
script per name (`install` writes them, the Dockerfile runs it) that lands here: the name picks
our agent (`gpu-operator agent ...`) and the rest of the command line and the environment pass
through unchanged, so the pod template needs nothing else. `nvidia-validator` is three programs
upstream, told apart by `COMPONENT`: the validations, the node status exporter (`metrics`) and the
sandbox validations.

Go's flag packages also accept `-flag`, `--flag=true` and `--flag=false` where click wants
`--flag` / `--no-flag`; `normalize` rewrites those for the options the agent declares.
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class EntryPoint:
    """An NVIDIA program name and the agent sub-command that stands for it."""

    name: str
    agent: str
    image: str  # NVIDIA's image that ships the program (for the docs and the support table)
    what: str


ENTRY_POINTS: tuple[EntryPoint, ...] = (
    EntryPoint("nvidia-device-plugin", "device-plugin", "k8s-device-plugin", "device plugin"),
    EntryPoint("config-manager", "config-manager", "k8s-device-plugin", "config manager"),
    EntryPoint(
        "mps-control-daemon", "mps-control-daemon", "k8s-device-plugin", "MPS control daemon"
    ),
    EntryPoint(
        "gpu-feature-discovery",
        "gpu-feature-discovery",
        "k8s-device-plugin",
        "GPU feature discovery",
    ),
    EntryPoint("dcgm-exporter", "dcgm-exporter", "dcgm-exporter", "GPU metrics exporter"),
    EntryPoint("nvidia-mig-manager", "mig-manager", "k8s-mig-manager", "MIG manager"),
    EntryPoint(
        "nvidia-validator",
        "validator",
        "gpu-operator",
        "validator, node status exporter (COMPONENT=metrics), sandbox validator",
    ),
    EntryPoint(
        "vectorAdd", "vector-add", "gpu-operator", "the validator's CUDA workload (cuda, plugin)"
    ),
    EntryPoint("driver-manager", "driver-manager", "k8s-driver-manager", "driver manager"),
    EntryPoint("vfio-manage", "vfio-manager", "k8s-driver-manager", "VFIO manager"),
    EntryPoint(
        "nvidia-k8s-vgpu-dm", "vgpu-device-manager", "vgpu-device-manager", "vGPU device manager"
    ),
    EntryPoint(
        "nvidia-kubevirt-gpu-device-plugin",
        "sandbox-device-plugin",
        "kubevirt-gpu-device-plugin",
        "sandbox (KubeVirt) device plugin",
    ),
    EntryPoint(
        "gpu-kubelet-plugin",
        "dra-kubelet-plugin",
        "k8s-dra-driver-gpu",
        "GPU DRA kubelet plugin",
    ),
    EntryPoint(
        "compute-domain-kubelet-plugin",
        "compute-domain-kubelet-plugin",
        "k8s-dra-driver-gpu",
        "compute-domain kubelet plugin",
    ),
    EntryPoint(
        "compute-domain-controller",
        "compute-domain-controller",
        "k8s-dra-driver-gpu",
        "compute-domain controller",
    ),
    EntryPoint("nvidia-toolkit", "container-toolkit", "container-toolkit", "toolkit configurator"),
    EntryPoint(
        "nvidia-ctk-installer", "container-toolkit", "container-toolkit", "toolkit configurator"
    ),
)
BY_NAME: Mapping[str, EntryPoint] = {e.name: e for e in ENTRY_POINTS}
NAMES: tuple[str, ...] = tuple(e.name for e in ENTRY_POINTS)

# `nvidia-validator`'s COMPONENT values that are other programs of ours.
METRICS_COMPONENT = "metrics"
SANDBOX_COMPONENTS = frozenset({"vfio-pci", "vgpu-manager", "vgpu-devices", "cc-manager"})
COMPONENT_FLAGS = ("--component", "-c")


class UnknownEntryPoint(LookupError):
    """The program name is none of NVIDIA's that we stand in for."""


def _component(args: Sequence[str], env: Mapping[str, str]) -> str:
    """COMPONENT from `--component X`, `--component=X`, `-c X`, else the environment."""
    for i, arg in enumerate(args):
        for flag in COMPONENT_FLAGS:
            if arg == flag and i + 1 < len(args):
                return args[i + 1]
            if arg.startswith(flag + "="):
                return arg[len(flag) + 1 :]
    return env.get("COMPONENT", "")


def _without_component_flag(args: Sequence[str]) -> list[str]:
    out: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
            continue
        if arg in COMPONENT_FLAGS:
            skip = True
            continue
        if any(arg.startswith(f + "=") for f in COMPONENT_FLAGS):
            continue
        out.append(arg)
    return out


def resolve(name: str, args: Sequence[str], env: Mapping[str, str]) -> list[str]:
    """The `gpu-operator agent` command line that stands for `name args...`."""
    entry = BY_NAME.get(Path(name).name)
    if entry is None:
        raise UnknownEntryPoint(f"{name}: not one of NVIDIA's entry points ({', '.join(NAMES)})")
    if entry.name == "nvidia-validator":
        component = _component(args, env)
        if component == METRICS_COMPONENT:
            return ["node-status-exporter", *_without_component_flag(args)]
        if component in SANDBOX_COMPONENTS:
            return ["sandbox-validator", *args]
    return [entry.agent, *args]


def _options(command: Any) -> tuple[set[str], dict[str, tuple[str, str | None]]]:
    """Every option string, and for boolean flags `--x` its (on, off) spellings (typer's click
    command, read by its attributes: typer may carry its own copy of click)."""
    names: set[str] = set()
    flags: dict[str, tuple[str, str | None]] = {}
    for param in command.params:
        if getattr(param, "param_type_name", "") != "option":
            continue
        names.update(param.opts)
        names.update(param.secondary_opts)
        if param.is_flag:
            on = next((o for o in param.opts if o.startswith("--")), None)
            off = next((o for o in param.secondary_opts if o.startswith("--")), None)
            if on is not None:
                for opt in param.opts:
                    flags[opt] = (on, off)
    return names, flags


def normalize(command: Any, args: Sequence[str]) -> list[str]:
    """Go-style spellings (`-flag`, `--flag=true|false`) as click spells them for `command`."""
    names, flags = _options(command)
    out: list[str] = []
    for index, arg in enumerate(args):
        if arg == "--":
            out.extend(args[index:])
            break
        name, eq, value = arg.partition("=")
        single_dash = name.startswith("-") and not name.startswith("--") and len(name) > 2
        if single_dash and "-" + name in names:  # a Go single-dash long flag
            name = "-" + name
            arg = name + eq + value
        if eq and name in flags:
            on, off = flags[name]
            lowered = value.lower()
            if lowered in ("true", "1", "t", "yes"):
                out.append(on)
                continue
            if lowered in ("false", "0", "f", "no") and off is not None:
                out.append(off)
                continue
            if lowered in ("false", "0", "f", "no"):
                continue  # a flag without an off spelling is off when absent
        out.append(arg)
    return out


def _agent_command(agent: str) -> Any:
    from typer.main import get_command

    from gpu_operator.agents import cli as agents_cli

    return get_command(agents_cli.app).commands[agent]  # type: ignore[attr-defined]


def agent_argv(name: str, args: Sequence[str], env: Mapping[str, str]) -> list[str]:
    """The full `agent` argv: resolved, then normalised for the agent's options."""
    resolved = resolve(name, args, env)
    return [resolved[0], *normalize(_agent_command(resolved[0]), resolved[1:])]


def run(name: str, args: Sequence[str]) -> int:
    """Run NVIDIA's program `name` as our agent; the exit status."""
    try:
        argv = agent_argv(name, args, os.environ)
    except UnknownEntryPoint as err:
        sys.stderr.write(f"gpu-operator: {err}\n")
        return 127
    try:
        # The agent's own command, so usage and errors name NVIDIA's program.
        _agent_command(argv[0]).main(args=argv[1:], prog_name=Path(name).name)
    except SystemExit as exit_:
        code = exit_.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    return 0


def main(name: str | None = None) -> None:
    """The body of every installed entry-point script (its name says which program it is)."""
    raise SystemExit(run(name or Path(sys.argv[0]).name, sys.argv[1:]))


SCRIPT = """#!{python}
# NVIDIA's `{name}` in the gpu-operator image: runs `gpu-operator agent {agent}` with the same
# arguments and environment (gpu_operator.agents.entrypoints).
from gpu_operator.agents.entrypoints import main

main({name!r})
"""


def install(directory: Path, python: str | None = None) -> list[Path]:
    """Write one executable script per NVIDIA name into `directory` (the image's PATH)."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for entry in ENTRY_POINTS:
        path = directory / entry.name
        path.write_text(
            SCRIPT.format(python=python or sys.executable, name=entry.name, agent=entry.agent)
        )
        path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        written.append(path)
    return written


if __name__ == "__main__":
    # `python -m gpu_operator.agents.entrypoints install DIR [PYTHON]`, or `NAME ARGS...`.
    if len(sys.argv) >= 3 and sys.argv[1] == "install":
        for path in install(Path(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else None):
            sys.stdout.write(f"{path}\n")
        raise SystemExit(0)
    if len(sys.argv) < 2:
        sys.stderr.write("usage: python -m gpu_operator.agents.entrypoints NAME [ARGS...]\n")
        raise SystemExit(2)
    raise SystemExit(run(sys.argv[1], sys.argv[2:]))
