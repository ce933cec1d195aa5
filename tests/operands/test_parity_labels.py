"""Every operand DaemonSet's selector and pod labels equal upstream's.

Upstream facts (NVIDIA/gpu-operator `assets/state-*/…daemonset.yaml`, `manifests/state-driver`):
each operand DaemonSet selects its pods on `app: <DaemonSet name>` alone, except GPU feature
discovery (also `app.kubernetes.io/part-of: nvidia-gpu`) and the two validators (also
`app.kubernetes.io/part-of: gpu-operator`); pod labels are the selector's, plus, on driver pods,
`app.kubernetes.io/component: nvidia-driver` and `nvidia.com/precompiled`. A selector is
immutable, so any other selector makes taking over NVIDIA's DaemonSets fail; other pod labels
would restart every pod on takeover. Our `nvidia.com/gpu-operator.state` label stays on the
DaemonSet object only.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest
from operand_helpers import make_facts, make_policy, render_ds

from gpu_operator.api import NVIDIADriverSpec, keys
from gpu_operator.operands import (
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
    nvidiadriver,
    operator_validation,
    registry,
    sandbox_device_plugin,
    sandbox_validation,
    vfio_manager,
    vgpu_device_manager,
    vgpu_manager,
)

PART_OF = "app.kubernetes.io/part-of"
COMPONENT = "app.kubernetes.io/component"
SANDBOX: dict[str, Any] = {"sandboxWorkloads": {"enabled": True}}
KATA: dict[str, Any] = {"sandboxWorkloads": {"enabled": True, "defaultWorkload": "vm-passthrough"}}


def only_app(name: str) -> dict[str, str]:
    return {"app": name}


# module -> (upstream selector, extra upstream pod labels, upstream pod annotations)
UPSTREAM: list[tuple[ModuleType, dict[str, str], dict[str, str], dict[str, str]]] = [
    (
        driver,
        only_app("nvidia-driver-daemonset"),
        {COMPONENT: "nvidia-driver", "nvidia.com/precompiled": "false"},
        {"kubectl.kubernetes.io/default-container": "nvidia-driver-ctr"},
    ),
    (container_toolkit, only_app("nvidia-container-toolkit-daemonset"), {}, {}),
    (
        operator_validation,
        {"app": "nvidia-operator-validator", PART_OF: "gpu-operator"},
        {},
        {},
    ),
    (device_plugin, only_app("nvidia-device-plugin-daemonset"), {}, {}),
    (mps_control_daemon, only_app("nvidia-device-plugin-mps-control-daemon"), {}, {}),
    (dcgm, only_app("nvidia-dcgm"), {}, {}),
    (dcgm_exporter, only_app("nvidia-dcgm-exporter"), {}, {}),
    (gpu_feature_discovery, {"app": "gpu-feature-discovery", PART_OF: "nvidia-gpu"}, {}, {}),
    (mig_manager, only_app("nvidia-mig-manager"), {}, {}),
    (node_status_exporter, only_app("nvidia-node-status-exporter"), {}, {}),
    (
        vgpu_manager,
        only_app("nvidia-vgpu-manager-daemonset"),
        {},
        {"kubectl.kubernetes.io/default-container": "nvidia-vgpu-manager-ctr"},
    ),
    (vgpu_device_manager, only_app("nvidia-vgpu-device-manager"), {}, {}),
    (sandbox_validation, {"app": "nvidia-sandbox-validator", PART_OF: "gpu-operator"}, {}, {}),
    (vfio_manager, only_app("nvidia-vfio-manager"), {}, {}),
    (sandbox_device_plugin, only_app("nvidia-sandbox-device-plugin-daemonset"), {}, {}),
    (kata_device_plugin, only_app("nvidia-kata-sandbox-device-plugin-daemonset"), {}, {}),
    (cc_manager, only_app("nvidia-cc-manager"), {}, {}),
]
IDS = [entry[1]["app"] for entry in UPSTREAM]


def render(module: ModuleType, **sections: Any) -> dict[str, Any]:
    return render_ds(module, make_policy(**sections))


@pytest.mark.parametrize(("module", "selector", "extra", "annotations"), UPSTREAM, ids=IDS)
def test_selector_and_pod_labels_equal_upstream(
    module: ModuleType, selector: dict[str, str], extra: dict[str, str], annotations: dict[str, str]
) -> None:
    ds = render(module)
    assert ds["spec"]["selector"] == {"matchLabels": selector}
    template = ds["spec"]["template"]["metadata"]
    assert template["labels"] == {**selector, **extra}
    assert template.get("annotations", {}) == annotations
    # The DaemonSet object itself carries upstream's labels plus our state label.
    assert ds["metadata"]["labels"] == {
        **selector,
        **extra,
        keys.OPERATOR_STATE_LABEL: module.NAME,
    }


@pytest.mark.parametrize(("module", "selector", "extra", "annotations"), UPSTREAM, ids=IDS)
def test_user_daemonset_labels_never_touch_the_selector(
    module: ModuleType, selector: dict[str, str], extra: dict[str, str], annotations: dict[str, str]
) -> None:
    # Upstream copies daemonsets.labels onto the pods, except `app` and part-of.
    user = {"team": "ml", "app": "x", PART_OF: "x", keys.OPERATOR_STATE_LABEL: "x"}
    ds = render(module, daemonsets={"labels": user})
    assert ds["spec"]["selector"] == {"matchLabels": selector}
    assert ds["spec"]["template"]["metadata"]["labels"] == {**selector, **extra, "team": "ml"}


def test_every_operand_daemonset_is_pinned_here() -> None:
    assert sorted(IDS) == sorted(registry.OPERAND_APPS)


def test_precompiled_driver_daemonsets_share_upstreams_selector_and_labels() -> None:
    # Upstream's precompiled transform renames the DaemonSet per kernel, sets
    # nvidia.com/precompiled=true and adds the kernel nodeSelector; selector and `app` stay.
    facts = make_facts(kernels=("6.8.0-1017-aws", "5.15.0-105-generic"))
    objects = driver.render(make_policy(driver={"usePrecompiled": True}), facts)
    daemonsets = [o for o in objects if o["kind"] == "DaemonSet"]
    assert len(daemonsets) == 2
    for ds in daemonsets:
        assert ds["spec"]["selector"] == {"matchLabels": {"app": "nvidia-driver-daemonset"}}
        assert ds["spec"]["template"]["metadata"]["labels"] == {
            "app": "nvidia-driver-daemonset",
            COMPONENT: "nvidia-driver",
            "nvidia.com/precompiled": "true",
        }


def nvidiadriver_pool(precompiled: bool = False) -> dict[str, Any]:
    spec = NVIDIADriverSpec.model_validate(
        {"driverType": "gpu", "usePrecompiled": precompiled, "version": "580.95.05"}
    )
    item = nvidiadriver.DriverInput("default", "0123-uid", spec)
    pool = nvidiadriver.Pool(
        os_id="ubuntu",
        os_version_id="22.04",
        os_tag="ubuntu22.04",
        kernel="6.8.0-52-generic" if precompiled else None,
        nodes=("gpu-1",),
        selector=(),
    )
    return nvidiadriver.render_pool(item, pool, make_policy(), make_facts())


@pytest.mark.parametrize("precompiled", [False, True])
def test_nvidiadriver_pool_selects_on_app_with_upstreams_pod_labels(precompiled: bool) -> None:
    ds = nvidiadriver_pool(precompiled=precompiled)
    name = ds["metadata"]["name"]
    assert ds["spec"]["selector"] == {"matchLabels": {"app": name}}
    expected = {
        "app": name,
        "nvidia.com/node.os-version": "ubuntu22.04",
        "nvidia.com/precompiled": "true" if precompiled else "false",
        COMPONENT: "nvidia-driver",
    }
    if precompiled:
        expected["nvidia.com/precompiled.kernel-version"] = "6.8.0-52-generic"
    assert ds["spec"]["template"]["metadata"]["labels"] == expected
    assert ds["spec"]["template"]["metadata"]["annotations"] == {
        "kubectl.kubernetes.io/default-container": "nvidia-driver-ctr"
    }
