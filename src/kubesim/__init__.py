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
from kubesim.errors import ApiError
from kubesim.faults import FaultRule, Faults
from kubesim.programs import ContainerView, ProgramRun
from kubesim.runner_logs import ContainerLogHandler
from kubesim.stats import Stats
from kubesim.store import Store

__all__ = [
    "ApiError",
    "Cluster",
    "ContainerLogHandler",
    "ContainerView",
    "FaultRule",
    "Faults",
    "KubeletConfig",
    "PodContext",
    "PodRunner",
    "PodRunnerFunction",
    "PodRunnerObject",
    "ProgramRun",
    "RunnerRegistration",
    "Stats",
    "Store",
]
