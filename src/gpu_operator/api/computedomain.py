"""ComputeDomain and ComputeDomainClique (resource.nvidia.com/v1beta1, namespaced): NVIDIA's
DRA driver API for multi-node NVLink (IMEX) domains, with its names and keys.

A ComputeDomain asks for an IMEX domain across the nodes its workload pods land on: the
compute-domain controller (controller/computedomain.py, planner computedomains/) creates the
workload's ResourceClaimTemplate (`spec.channel.resourceClaimTemplate.name`) and a DaemonSet of
IMEX daemons that follows the nodes where a channel claim was prepared, and reports each node's
daemon in `status.nodes`. A ComputeDomainClique (`<domain UID>.<clique id>`, in the driver's
namespace) lists the domain's daemons of one NVLink partition. Facts: docs/compute-domains.md.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, field_validator

from gpu_operator.api.base import K8sModel

GROUP = "resource.nvidia.com"
VERSION = "v1beta1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "ComputeDomain"
PLURAL = "computedomains"
CLIQUE_KIND = "ComputeDomainClique"
CLIQUE_PLURAL = "computedomaincliques"

# The compute-domain DRA driver, its device classes and its opaque config kinds (NVIDIA's).
DRIVER = "compute-domain.nvidia.com"
DEFAULT_CHANNEL_CLASS = "compute-domain-default-channel.nvidia.com"
DAEMON_CLASS = "compute-domain-daemon.nvidia.com"
CHANNEL_CONFIG_KIND = "ComputeDomainChannelConfig"
DAEMON_CONFIG_KIND = "ComputeDomainDaemonConfig"
# The domain's UID on everything made for it: its templates, DaemonSet, daemon pods, the nodes a
# channel was prepared on (the DaemonSet's node selector), and its finalizer.
DOMAIN_LABEL = "resource.nvidia.com/computeDomain"
CLIQUE_LABEL = "resource.nvidia.com/computeDomain.cliqueID"
TARGET_LABEL = "resource.nvidia.com/computeDomainTarget"
TARGET_WORKLOAD = "Workload"
TARGET_DAEMON = "Daemon"
FINALIZER = DOMAIN_LABEL
# GFD's node label: `<cluster UUID>.<clique id>` of the node's NVLink partition.
NODE_CLIQUE_LABEL = "nvidia.com/gpu.clique"

READY = "Ready"
NOT_READY = "NotReady"
ALLOCATION_SINGLE = "Single"
ALLOCATION_ALL = "All"

_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


class ComputeDomainResourceClaimTemplate(K8sModel):
    """The ResourceClaimTemplate the controller creates for the workload's pods."""

    name: str = Field(description="Name of the ResourceClaimTemplate (in the domain's namespace).")

    @field_validator("name")
    @classmethod
    def _dns_name(cls, value: str) -> str:
        if len(value) > 253 or not _DNS_SUBDOMAIN.match(value):
            raise ValueError(
                f"{value!r} is not a valid object name: lower-case letters, digits, '-' and "
                "'.', starting and ending with a letter or digit, at most 253 characters"
            )
        return value


class ComputeDomainChannelSpec(K8sModel):
    """The IMEX channel each workload pod gets."""

    resourceClaimTemplate: ComputeDomainResourceClaimTemplate
    allocationMode: Literal["All", "Single"] = Field(
        default="Single",
        description="Single: one channel (channel 0) per pod; All: every channel of the domain.",
    )


class ComputeDomainSpec(K8sModel):
    """The domain: how many nodes it is Ready at, and the channel template of its workload."""

    numNodes: int = Field(
        default=0,
        ge=0,
        description="Nodes whose IMEX daemons must be ready for status Ready (0: any number).",
    )
    channel: ComputeDomainChannelSpec


class ComputeDomainNode(K8sModel):
    """One node of the domain and its IMEX daemon."""

    name: str
    ipAddress: str
    cliqueID: str
    index: int = 0
    status: Literal["Ready", "NotReady"] = "NotReady"


class ComputeDomainStatus(K8sModel):
    """Ready when numNodes nodes' IMEX daemons are ready (any ready daemon when numNodes is 0)."""

    status: Literal["Ready", "NotReady"] = "NotReady"
    nodes: list[ComputeDomainNode] | None = None


class ComputeDomain(K8sModel):
    """A multi-node NVLink (IMEX) domain for one workload."""

    apiVersion: Literal["resource.nvidia.com/v1beta1"] = "resource.nvidia.com/v1beta1"
    kind: Literal["ComputeDomain"] = "ComputeDomain"
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: ComputeDomainSpec
    status: ComputeDomainStatus | None = None


class ComputeDomainDaemonInfo(K8sModel):
    """One IMEX daemon of a clique."""

    nodeName: str
    ipAddress: str
    cliqueID: str
    index: int = 0
    status: Literal["Ready", "NotReady"] = "NotReady"


class ComputeDomainClique(K8sModel):
    """The daemons of one ComputeDomain in one NVLink partition (`<domain UID>.<clique id>`)."""

    apiVersion: Literal["resource.nvidia.com/v1beta1"] = "resource.nvidia.com/v1beta1"
    kind: Literal["ComputeDomainClique"] = "ComputeDomainClique"
    metadata: dict[str, Any] = Field(default_factory=dict)
    daemons: list[ComputeDomainDaemonInfo] | None = None


def clique_name(domain_uid: str, clique: str) -> str:
    return f"{domain_uid}.{clique}"
