"""The container runtime behind the simulated kubelets: a CRI hook the embedding program registers.

kubesim has no container runtime of its own. A program that simulates one (containerd, CRI-O)
registers a `RuntimeService` with `Cluster.register_container_runtime`; the kubelet then asks it
to run each pod's sandbox with the pod's runtime handler (from its RuntimeClass) and to create
each container, and reports its refusals as the real kubelet reports them:

- `run_sandbox` raising `CriError`: Event `FailedCreatePodSandBox` "Failed to create pod sandbox:
  rpc error: code = Unknown desc = <message>", the pod stays ContainerCreating and the kubelet
  retries with its back-off;
- `create_container` raising `CriError`: the container waits in `CreateContainerError` with the
  message and an Event `Failed` "Error: <message>", retried with back-off;
- `create_container` raising `StartContainerError` (the OCI runtime failed to start the process:
  a hook, a missing runtime binary): the container terminates with reason `StartError` and exit
  code 128, and the restart policy decides what follows.

Without a registered service every sandbox and container is created as before.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from kubesim.programs import ContainerView

# Annotations whose values name CDI devices (the CDI specification's `cdi.k8s.io/` prefix); the
# kubelet passes a device plugin's annotations to the runtime with the container.
CDI_ANNOTATION_PREFIX = "cdi.k8s.io/"


class CriError(Exception):
    """A CRI call the runtime refused: its message, as gRPC carries it (code Unknown unless
    said), which the kubelet quotes in Events and container states."""

    def __init__(self, message: str, *, code: str = "Unknown") -> None:
        super().__init__(message)
        self.message = message
        self.code = code

    @property
    def rpc_message(self) -> str:
        """The error as the kubelet prints a failed gRPC call."""
        return f"rpc error: code = {self.code} desc = {self.message}"


class StartContainerError(CriError):
    """The runtime created the container but could not start its process (runc, a runtime
    hook or the OCI runtime binary failed): the container terminates with `StartError`."""


@dataclass(frozen=True)
class PodSandbox:
    """What the kubelet asks the runtime to run: the pod's sandbox on a node with a handler
    ("" is the runtime's default handler). `id` is the 64-hex-digit sandbox ID."""

    id: str
    node: str
    pod: dict[str, Any]
    handler: str
    attempt: int = 0


class RuntimeService(Protocol):
    """A simulated container runtime (the CRI RuntimeService calls the kubelet makes)."""

    def run_sandbox(self, sandbox: PodSandbox) -> None:
        """Run the pod's sandbox, or raise `CriError` with the runtime's message."""

    def create_container(self, view: ContainerView) -> None:
        """Create (and prepare to start) one container of a running sandbox, or raise
        `CriError` (CreateContainerError) / `StartContainerError` (StartError)."""


def sandbox_id(uid: str, attempt: int) -> str:
    """A stable sandbox ID for a pod's n-th sandbox attempt (containerd's are 64 hex digits)."""
    return hashlib.sha256(f"{uid}/sandbox/{attempt}".encode()).hexdigest()


def cdi_devices(cdi_names: Iterable[str], annotations: Mapping[str, str]) -> tuple[str, ...]:
    """The CDI devices a container is created with: the CRI `CDIDevices` field (from device
    plugins' Allocate responses) and the names in `cdi.k8s.io/*` annotations (comma-separated
    values), de-duplicated in that order."""
    names: dict[str, None] = dict.fromkeys(str(n) for n in cdi_names if n)
    for key in sorted(annotations):
        if key.startswith(CDI_ANNOTATION_PREFIX):
            for name in str(annotations[key]).split(","):
                if name.strip():
                    names.setdefault(name.strip(), None)
    return tuple(names)


def runtime_class_not_found(name: str) -> str:
    """The API error text for a missing RuntimeClass, as the kubelet's RuntimeClass manager
    returns it (and the kubelet quotes it after "Failed to create pod sandbox: ")."""
    return f'runtimeclass.node.k8s.io "{name}" not found'
