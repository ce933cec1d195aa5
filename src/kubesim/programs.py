"""Programs inside containers: executables registered by name that a container can run as its
command and that `kubectl exec` finds, each present only in the containers its predicate accepts.

kubesim has no images, so nothing is installed anywhere by default. A registration says "this
program exists in containers like these" (for example, a runtime hook injects it when the
container got a device): a container whose command names it runs it (its output is the container
log, its return value the exit code), and an exec of it runs it too. A registered program that is
absent from a container fails the way the runtime reports a missing executable.
"""

from __future__ import annotations

import asyncio
import posixpath
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

# runc's message when a container's own command cannot be found (the container never starts;
# the kubelet reports it as terminated with reason StartError and exit code 128).
START_ERROR_EXIT = 128
START_ERROR_REASON = "StartError"


class Output(Protocol):
    """Where a program writes (the container log, or an exec stream)."""

    def write(self, data: str | bytes) -> int: ...


@dataclass
class ContainerView:
    """What a predicate and a program may look at: the container as the runtime started it.

    `env` is the environment the container process gets: its spec (literal values and the
    common downward-API references) plus what device plugins' Allocate added. `allocation` is
    the kubelet's record of the devices allocated to this container (None without any).
    `runtime_handler` is the CRI handler of the pod's RuntimeClass ("" for the runtime's
    default) and `cdi_devices` the CDI device names the kubelet passes the runtime (device
    plugins' CDI devices and `cdi.k8s.io/` annotations, see kubesim.cri).
    """

    pod: dict[str, Any]
    container: dict[str, Any]
    node_name: str
    env: dict[str, str]
    init: bool = False
    allocation: Any = None
    runtime_handler: str = ""
    cdi_devices: tuple[str, ...] = ()

    @property
    def container_name(self) -> str:
        return str(self.container.get("name", ""))


@dataclass
class ProgramRun:
    """One run of a program: its argv, the container it runs in, and its I/O."""

    argv: list[str]
    view: ContainerView
    stdout: Output
    stderr: Output
    stdin: asyncio.StreamReader
    tty: bool = False
    # True for `kubectl exec`, False when the program is the container's command.
    exec: bool = False


Program = Callable[[ProgramRun], Awaitable[int | None]]
Predicate = Callable[[ContainerView], bool]


def program_name(argv0: str) -> str:
    """The name a program is registered under: argv[0] without its directory."""
    return posixpath.basename(argv0)


def container_argv(container: dict[str, Any]) -> list[str]:
    """What the container runs: `command` + `args`; without a command, `args` alone (kubesim
    has no images, so an image is treated as having no ENTRYPOINT: its CMD is replaced)."""
    command = [str(c) for c in container.get("command") or []]
    args = [str(a) for a in container.get("args") or []]
    return command + args if command else args


@dataclass
class Registration:
    name: str
    program: Program
    available: Predicate | None = None

    def present_in(self, view: ContainerView) -> bool:
        return self.available is None or bool(self.available(view))


@dataclass
class ProgramRegistry:
    """Programs by name; the last registration of a name wins."""

    programs: dict[str, Registration] = field(default_factory=dict)

    def register(self, name: str, program: Program, *, available: Predicate | None = None) -> None:
        """Make `name` (e.g. "nvidia-smi") runnable in containers for which `available` holds
        (every container when None)."""
        if not name or "/" in name:
            raise ValueError(f"a program name is a file name without '/', got {name!r}")
        self.programs[name] = Registration(name, program, available)

    def unregister(self, name: str) -> None:
        self.programs.pop(name, None)

    def lookup(self, argv0: str) -> Registration | None:
        """The registration for an argv[0] (by its base name), present or not."""
        if not self.programs:
            return None
        return self.programs.get(program_name(argv0))


@dataclass(frozen=True)
class ProgramResult:
    """What one run of a program inside a container gave back (`PodContext.run_program`)."""

    code: int
    stdout: str
    stderr: str


def not_found_message(program: str) -> str:
    """What a process inside a container gets when the program it runs is not there (Go's
    `exec.Command` wording; a shell would say `not found` with exit code 127)."""
    if "/" in program:
        return f"fork/exec {program}: no such file or directory"
    return f'exec: "{program}": executable file not found in $PATH'


# A shell's exit code for a command it cannot find.
NOT_FOUND_EXIT = 127


def start_error_message(program: str) -> str:
    """What the runtime reports when a container's command is missing from its image."""
    if "/" in program:
        reason = f'exec: "{program}": stat {program}: no such file or directory'
    else:
        reason = f'exec: "{program}": executable file not found in $PATH'
    return (
        "failed to create containerd task: failed to create shim task: OCI runtime create "
        "failed: runc create failed: unable to start container process: error during container "
        f"init: {reason}: unknown"
    )
