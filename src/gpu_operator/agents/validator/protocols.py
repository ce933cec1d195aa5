"""The I/O the validator needs, as small protocols: its own container (files, programs, the
termination message) and the Kubernetes API. `host` has the real ones; the demo runs the same
runner on kubesim's pod context."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

Obj = dict[str, Any]


@dataclass(frozen=True)
class ProgramResult:
    """How a program run inside the container ended (127: not found)."""

    code: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


class Container(Protocol):
    """The validator's own container."""

    def path(self, container_path: str) -> Path:
        """Where a path of the container is (raises OSError when it cannot exist)."""
        ...

    async def run(self, argv: Sequence[str], env: Mapping[str, str] | None = None) -> ProgramResult:
        """Run a program in the container (`env` is added to the container's environment)."""
        ...

    def write_termination_message(self, text: str) -> None:
        """Write the container's termination message (its terminationMessagePath)."""
        ...


class Cluster(Protocol):
    """The API calls of the validator (None / empty where the object is not there)."""

    async def node(self, name: str) -> Obj | None: ...

    async def daemonset(self, namespace: str, name: str) -> Obj | None: ...

    async def daemonsets(self, namespace: str, labels: Mapping[str, str]) -> list[Obj]: ...

    async def pods(
        self, namespace: str, labels: Mapping[str, str], node: str | None = None
    ) -> list[Obj]: ...

    async def pod(self, namespace: str, name: str) -> Obj | None: ...

    async def create_pod(self, pod: Obj) -> Obj: ...

    async def delete_pod(self, namespace: str, name: str) -> None:
        """Delete at once (grace period 0, background propagation), as upstream does."""
        ...

    async def events(self, namespace: str, name: str) -> list[Obj]:
        """The Events about one object (empty when they cannot be read)."""
        ...

    async def pod_log(self, namespace: str, name: str, container: str) -> str:
        """A container's log ("" when it cannot be read)."""
        ...
