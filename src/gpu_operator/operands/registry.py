"""All operand states in upstream's order, and rendering them all with per-state errors."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from gpu_operator import api
from gpu_operator.api import images
from gpu_operator.operands import (
    cc_manager,
    container_toolkit,
    dcgm,
    dcgm_exporter,
    device_plugin,
    driver,
    gpu_feature_discovery,
    kata_device_plugin,
    kata_manager,
    mig_manager,
    mps_control_daemon,
    node_status_exporter,
    operator_metrics,
    operator_validation,
    pre_requisites,
    sandbox_device_plugin,
    sandbox_validation,
    vfio_manager,
    vgpu_device_manager,
    vgpu_manager,
)
from gpu_operator.operands.common import RenderError
from gpu_operator.operands.facts import ClusterFacts

Enabled = Callable[[api.ClusterPolicy, ClusterFacts], bool]
Render = Callable[[api.ClusterPolicy, ClusterFacts], list[dict[str, Any]]]


@dataclass(frozen=True)
class State:
    """One operand state: its name, enablement rule and renderer."""

    name: str
    enabled: Enabled
    render: Render


@dataclass(frozen=True)
class RenderedState:
    """What one state wants: its objects, or the reason it could not be rendered.

    `objects` is empty when the state is disabled (its labelled objects are then pruned) or when
    rendering failed (`error` set; the controller should keep the state's existing objects).
    """

    name: str
    enabled: bool
    objects: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None


def _state(module: ModuleType) -> State:
    return State(name=module.NAME, enabled=module.enabled, render=module.render)


STATES: tuple[State, ...] = tuple(
    _state(m)
    for m in (
        pre_requisites,
        operator_metrics,
        driver,
        container_toolkit,
        operator_validation,
        device_plugin,
        mps_control_daemon,
        dcgm,
        dcgm_exporter,
        gpu_feature_discovery,
        mig_manager,
        node_status_exporter,
        vgpu_manager,
        vgpu_device_manager,
        sandbox_validation,
        vfio_manager,
        sandbox_device_plugin,
        kata_device_plugin,
        kata_manager,
        cc_manager,
    )
)


# The `app` label of every operand DaemonSet's pods (ClusterPolicy states; precompiled driver
# DaemonSets keep `nvidia-driver-daemonset`). Pods carry upstream's labels only, so this, with the
# NVIDIADriver pools' component label, is how a pod is known as an operand pod.
OPERAND_APPS: tuple[str, ...] = tuple(
    sorted(
        m.DS_NAME
        for m in (
            cc_manager,
            container_toolkit,
            dcgm,
            dcgm_exporter,
            device_plugin,
            driver,
            gpu_feature_discovery,
            kata_device_plugin,
            mig_manager,
            mps_control_daemon,
            node_status_exporter,
            operator_validation,
            sandbox_device_plugin,
            sandbox_validation,
            vfio_manager,
            vgpu_device_manager,
            vgpu_manager,
        )
    )
)
# Label selectors (kubectl syntax) that together match every operand pod and no other pod.
OPERAND_POD_SELECTORS: tuple[str, ...] = (
    f"app in ({','.join(OPERAND_APPS)})",
    f"app.kubernetes.io/component={driver.COMPONENT}",
)


def render_all(policy: api.ClusterPolicy, facts: ClusterFacts) -> list[RenderedState]:
    """Render every state in order; one state's failure is reported and the others go on."""
    rendered: list[RenderedState] = []
    for state in STATES:
        if not state.enabled(policy, facts):
            rendered.append(RenderedState(state.name, enabled=False))
            continue
        try:
            objects = state.render(policy, facts)
        except (RenderError, images.ImageError) as err:
            rendered.append(RenderedState(state.name, enabled=True, error=f"{state.name}: {err}"))
            continue
        rendered.append(RenderedState(state.name, enabled=True, objects=objects))
    return rendered
