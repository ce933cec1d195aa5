"""The driver DaemonSet's pod fields at parity with upstream, for ClusterPolicy and NVIDIADriver
DaemonSets, precompiled and not.

Upstream facts (assets/state-driver and manifests/state-driver; the `nvidia-driver-startup-probe`
ConfigMap as upstream deploys it): one driver pod per node through a required pod anti-affinity on
`app.kubernetes.io/component` (ClusterPolicy: `nvidia-driver`; NVIDIADriver: `nvidia-driver` and
`nvidia-vgpu-manager`) with topology key `kubernetes.io/hostname`; `NODE_IP` from `status.hostIP`
next to `NODE_NAME` in the driver container; the pod annotation
`kubectl.kubernetes.io/default-container: nvidia-driver-ctr`; the startup probe runs a script
from ConfigMap `nvidia-driver-startup-probe` (key `startup-probe.sh`, volume
`driver-startup-probe-script`) that fails until the nvidia module is loaded
(/sys/module/nvidia/refcnt) and nvidia-smi works, then writes `.driver-ctr-ready` in one step with
the GDRCOPY_ENABLED, GDS_ENABLED and GPU_DIRECT_RDMA_ENABLED flags; defaults: 60 s initial delay
(precompiled: 5 s), 60 s timeout, 10 s period, 120 failures.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from operand_helpers import ctr, env_of, find, make_facts, make_policy, mounts_of, pod, volumes_of

from gpu_operator.api import NVIDIADriverSpec
from gpu_operator.operands import driver, nvidiadriver

DRIVER_CTR = "nvidia-driver-ctr"
KERNEL = "6.8.0-52-generic"


def cluster_policy_ds(precompiled: bool) -> dict[str, Any]:
    facts = make_facts(kernels=(KERNEL,))
    objects = driver.render(make_policy(driver={"usePrecompiled": precompiled}), facts)
    return find(objects, "DaemonSet")


def nvidiadriver_ds(precompiled: bool) -> dict[str, Any]:
    spec = NVIDIADriverSpec.model_validate(
        {"driverType": "gpu", "usePrecompiled": precompiled, "version": "580.95.05"}
    )
    pool = nvidiadriver.Pool(
        os_id="ubuntu",
        os_version_id="22.04",
        os_tag="ubuntu22.04",
        selector=(),
        kernel=KERNEL if precompiled else None,
        nodes=("gpu-1",),
    )
    item = nvidiadriver.DriverInput("default", "0123-uid", spec)
    return nvidiadriver.render_pool(item, pool, make_policy(), make_facts())


CASES = [
    ("clusterpolicy", False),
    ("clusterpolicy-precompiled", True),
    ("nvidiadriver", False),
    ("nvidiadriver-precompiled", True),
]


def render(case: str, precompiled: bool) -> dict[str, Any]:
    if case.startswith("clusterpolicy"):
        return cluster_policy_ds(precompiled)
    return nvidiadriver_ds(precompiled)


@pytest.mark.parametrize(("case", "precompiled"), CASES, ids=[c for c, _ in CASES])
def test_one_driver_pod_per_node_through_anti_affinity(case: str, precompiled: bool) -> None:
    components = (
        ["nvidia-driver"] if case.startswith("clusterpolicy") else
        ["nvidia-driver", "nvidia-vgpu-manager"]
    )  # fmt: skip
    assert pod(render(case, precompiled))["affinity"] == {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {
                        "matchExpressions": [
                            {
                                "key": "app.kubernetes.io/component",
                                "operator": "In",
                                "values": components,
                            }
                        ]
                    },
                    "topologyKey": "kubernetes.io/hostname",
                }
            ]
        }
    }


@pytest.mark.parametrize(("case", "precompiled"), CASES, ids=[c for c, _ in CASES])
def test_node_ip_default_container_and_startup_probe(case: str, precompiled: bool) -> None:
    ds = render(case, precompiled)
    main = ctr(ds, DRIVER_CTR)
    by_name = {e["name"]: e for e in main["env"]}
    assert by_name["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert by_name["NODE_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.hostIP"}}
    template = ds["spec"]["template"]["metadata"]
    assert template["annotations"]["kubectl.kubernetes.io/default-container"] == DRIVER_CTR
    probe = main["startupProbe"]
    assert probe["exec"]["command"] == ["sh", "/usr/local/bin/startup-probe.sh"]
    assert (
        probe["initialDelaySeconds"],
        probe["timeoutSeconds"],
        probe["periodSeconds"],
        probe["failureThreshold"],
    ) == (5 if precompiled else 60, 60, 10, 120)
    assert mounts_of(main)["/usr/local/bin/startup-probe.sh"] == "driver-startup-probe-script"
    [item] = [m for m in main["volumeMounts"] if m["name"] == "driver-startup-probe-script"]
    assert item["subPath"] == "startup-probe.sh"
    assert volumes_of(ds)["driver-startup-probe-script"]["configMap"]["name"] == (
        "nvidia-driver-startup-probe"
    )


def test_cluster_policy_renders_the_startup_probe_config_map() -> None:
    objects = driver.render(make_policy(), make_facts())
    cm = find(objects, "ConfigMap", "nvidia-driver-startup-probe")
    assert set(cm["data"]) == {"startup-probe.sh"}
    # Upstream's ConfigMap labels, plus our state label.
    assert cm["metadata"]["labels"]["app"] == "nvidia-driver-daemonset"
    assert cm["metadata"]["labels"]["app.kubernetes.io/component"] == "nvidia-driver"
    kinds = [o["kind"] for o in objects]
    assert kinds.index("ConfigMap") < kinds.index("DaemonSet")  # mounted, so applied first


def test_nvidiadriver_accounts_carry_the_startup_probe_config_map() -> None:
    spec = NVIDIADriverSpec.model_validate({"driverType": "gpu", "version": "580.95.05"})
    drivers = [
        nvidiadriver.DriverInput("a", "uid-a", spec),
        nvidiadriver.DriverInput("b", "uid-b", spec),
    ]
    objects = nvidiadriver.render_accounts(drivers, make_facts())
    cm = find(objects, "ConfigMap", "nvidia-driver-startup-probe")
    owners = [r["name"] for r in cm["metadata"]["ownerReferences"]]
    assert owners == ["a", "b"]  # the garbage collector removes it with the last driver


def run_probe(tmp_path: Path, *, module_loaded: bool, smi_ok: bool, env: dict[str, str]) -> Any:
    """Run the probe script with /sys, /run and nvidia-smi redirected into tmp_path."""
    script = driver.STARTUP_PROBE_SCRIPT
    root = tmp_path / "root"
    script = script.replace("/sys/module/nvidia/refcnt", f"{root}/sys/module/nvidia/refcnt")
    script = script.replace("/run/nvidia/validations", f"{root}/run/nvidia/validations")
    if module_loaded:
        (root / "sys/module/nvidia").mkdir(parents=True)
        (root / "sys/module/nvidia/refcnt").write_text("1\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\necho GPU 0\nexit {0 if smi_ok else 9}\n")
    smi.chmod(0o755)
    probe = tmp_path / "startup-probe.sh"
    probe.write_text(script)
    return subprocess.run(
        ["sh", str(probe)],
        env={"PATH": f"{bin_dir}:{os.environ['PATH']}", **env},
        capture_output=True,
        text=True,
        check=False,
    ), root / "run/nvidia/validations/.driver-ctr-ready"


def test_probe_fails_until_the_module_is_loaded(tmp_path: Path) -> None:
    result, ready = run_probe(tmp_path, module_loaded=False, smi_ok=True, env={})
    assert result.returncode == 1
    assert "not loaded" in result.stdout
    assert not ready.exists()


def test_probe_fails_while_nvidia_smi_fails(tmp_path: Path) -> None:
    result, ready = run_probe(tmp_path, module_loaded=True, smi_ok=False, env={})
    assert result.returncode == 1
    assert not ready.exists()


def test_probe_writes_the_ready_file_with_the_enabled_parts(tmp_path: Path) -> None:
    env = {"GDS_ENABLED": "true", "GPU_DIRECT_RDMA_ENABLED": "true"}
    result, ready = run_probe(tmp_path, module_loaded=True, smi_ok=True, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert ready.read_text().splitlines() == [
        "GDRCOPY_ENABLED: false",
        "GDS_ENABLED: true",
        "GPU_DIRECT_RDMA_ENABLED: true",
    ]
    assert not ready.with_name(".driver-ctr-ready.tmp").exists()


def test_env_of_driver_container_keeps_upstream_order() -> None:
    names = list(env_of(ctr(cluster_policy_ds(False), DRIVER_CTR)))
    assert names[:2] == ["NODE_NAME", "NODE_IP"]
