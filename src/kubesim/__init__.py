"""kubesim: an in-memory Kubernetes API server and core controllers. Knows nothing about GPUs."""

from kubesim.cluster import Cluster
from kubesim.controllers.kubelet import (
    KubeletConfig,
    PodContext,
    PodRunner,
    PodRunnerFunction,
    PodRunnerObject,
    RunnerRegistration,
)
from kubesim.cri import CriError, PodSandbox, RuntimeService, StartContainerError
from kubesim.errors import ApiError
from kubesim.faults import FaultRule, Faults
from kubesim.images import ImageCatalog
from kubesim.programs import ContainerView, ProgramResult, ProgramRun
from kubesim.runner_logs import ContainerLogHandler
from kubesim.stats import Stats
from kubesim.store import Store

__all__ = [
    "ApiError",
    "Cluster",
    "ContainerLogHandler",
    "ContainerView",
    "CriError",
    "FaultRule",
    "Faults",
    "ImageCatalog",
    "KubeletConfig",
    "PodContext",
    "PodRunner",
    "PodRunnerFunction",
    "PodRunnerObject",
    "PodSandbox",
    "ProgramResult",
    "ProgramRun",
    "RunnerRegistration",
    "RuntimeService",
    "StartContainerError",
    "Stats",
    "Store",
]
