"""Container toolkit and dcgm-exporter DaemonSets at parity with upstream.

Upstream facts (assets/state-container-toolkit, assets/state-dcgm-exporter and TransformToolkit /
TransformDCGMExporter in controllers/object_controls.go):
- toolkit container: SELinux level `s0`; `NRI_NAMESPACE` (the operator namespace); the host root
  at /host read-only with `mountPropagation: HostToContainer`; a `crio-hooks` volume from
  /run/containers/oci/hooks.d at /usr/share/containers/oci/hooks.d, whose host path becomes
  /usr/share/containers/oci/hooks.d on CRI-O nodes off OpenShift; with CDI `CRIO_CONFIG_MODE=config`
  whatever the runtime, without CDI on CRI-O `CRIO_CONFIG_MODE=hook`.
- exporter container: no command (the image's entrypoint; the distroless image has no shell);
  `DCGM_EXPORTER_COLLECTORS=/etc/dcgm-exporter/dcp-metrics-included.csv` unless a metrics ConfigMap
  is named; the counters that file enables are pinned below.
"""

from __future__ import annotations

from typing import Any

import pytest
from operand_helpers import ctr, env_of, find, make_facts, make_policy, mounts_of, volumes_of

from gpu_operator.agents.dcgm_exporter import command as exporter_command
from gpu_operator.agents.dcgm_exporter import counters
from gpu_operator.operands import container_toolkit, dcgm_exporter, operator_validation

TOOLKIT = "nvidia-container-toolkit-ctr"
EXPORTER = "nvidia-dcgm-exporter"


def toolkit(runtime: str = "containerd", **sections: Any) -> dict[str, Any]:
    objects = container_toolkit.render(make_policy(**sections), make_facts(runtime=runtime))
    return find(objects, "DaemonSet")


def test_toolkit_selinux_level_and_nri_namespace() -> None:
    main = ctr(toolkit(), TOOLKIT)
    assert main["securityContext"] == {"privileged": True, "seLinuxOptions": {"level": "s0"}}
    [nri] = [e for e in main["env"] if e["name"] == "NRI_NAMESPACE"]
    assert nri["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}


def test_toolkit_host_root_is_read_only_with_host_to_container_propagation() -> None:
    [root] = [m for m in ctr(toolkit(), TOOLKIT)["volumeMounts"] if m["name"] == "host-root"]
    assert root == {
        "name": "host-root",
        "mountPath": "/host",
        "readOnly": True,
        "mountPropagation": "HostToContainer",
    }


@pytest.mark.parametrize(
    ("runtime", "host_dir"),
    [
        ("containerd", "/run/containers/oci/hooks.d"),
        ("docker", "/run/containers/oci/hooks.d"),
        ("crio", "/usr/share/containers/oci/hooks.d"),
    ],
)
def test_toolkit_oci_hooks_mount(runtime: str, host_dir: str) -> None:
    ds = toolkit(runtime)
    assert mounts_of(ctr(ds, TOOLKIT))["/usr/share/containers/oci/hooks.d"] == "crio-hooks"
    assert volumes_of(ds)["crio-hooks"]["hostPath"] == {"path": host_dir}


@pytest.mark.parametrize(
    ("runtime", "cdi", "mode"),
    [
        ("containerd", True, "config"),
        ("crio", True, "config"),
        ("crio", False, "hook"),
        ("containerd", False, None),
    ],
)
def test_toolkit_crio_config_mode(runtime: str, cdi: bool, mode: str | None) -> None:
    env = env_of(ctr(toolkit(runtime, cdi={"enabled": cdi}), TOOLKIT))
    assert env.get("CRIO_CONFIG_MODE") == mode


def test_toolkit_driver_validation_runs_at_selinux_level_s0() -> None:
    validation = ctr(toolkit(), "driver-validation")
    assert validation["securityContext"]["seLinuxOptions"] == {"level": "s0"}


def exporter(**sections: Any) -> dict[str, Any]:
    objects = dcgm_exporter.render(make_policy(**sections), make_facts())
    return find(objects, "DaemonSet")


def test_exporter_starts_with_the_image_entrypoint() -> None:
    main = ctr(exporter(), EXPORTER)
    assert "command" not in main
    assert "args" not in main


def test_exporter_default_collectors_are_the_images_dcp_file() -> None:
    assert env_of(ctr(exporter(), EXPORTER))["DCGM_EXPORTER_COLLECTORS"] == (
        "/etc/dcgm-exporter/dcp-metrics-included.csv"
    )


# The counters dcgm-exporter's dcp-metrics-included.csv enables (the file upstream's DaemonSet
# names), in file order.
UPSTREAM_DEFAULT_COUNTERS = [
    ("DCGM_FI_DEV_SM_CLOCK", "gauge"),
    ("DCGM_FI_DEV_MEM_CLOCK", "gauge"),
    ("DCGM_FI_DEV_MEMORY_TEMP", "gauge"),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge"),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge"),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter"),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter"),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge"),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge"),
    ("DCGM_FI_DEV_ENC_UTIL", "gauge"),
    ("DCGM_FI_DEV_DEC_UTIL", "gauge"),
    ("DCGM_FI_DEV_XID_ERRORS", "gauge"),
    ("DCGM_FI_DEV_FB_FREE", "gauge"),
    ("DCGM_FI_DEV_FB_USED", "gauge"),
    ("DCGM_FI_DEV_FB_RESERVED", "gauge"),
    ("DCGM_FI_DEV_RETIRED_SBE", "counter"),
    ("DCGM_FI_DEV_RETIRED_DBE", "counter"),
    ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "counter"),
    ("DCGM_FI_DEV_VGPU_LICENSE_STATUS", "gauge"),
    ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter"),
    ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter"),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge"),
    ("DCGM_FI_DRIVER_VERSION", "label"),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge"),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge"),
    ("DCGM_FI_PROF_DRAM_ACTIVE", "gauge"),
    ("DCGM_FI_PROF_PCIE_TX_BYTES", "gauge"),
    ("DCGM_FI_PROF_PCIE_RX_BYTES", "gauge"),
]


def test_the_shipped_default_counters_equal_upstreams() -> None:
    parsed = counters.parse(dcgm_exporter.default_metrics_csv(), "dcp-metrics-included.csv")
    assert [(c.field.name, c.prom_type) for c in parsed.counters] == UPSTREAM_DEFAULT_COUNTERS


def test_the_exporter_reads_the_shipped_file_for_the_image_path() -> None:
    # Outside the image the path does not exist: our exporter reads its shipped copy.
    options = exporter_command.Options(collectors=dcgm_exporter.DEFAULT_COLLECTORS)
    path = exporter_command.counters_path(options)
    assert path is not None
    assert path.read_text() == dcgm_exporter.default_metrics_csv()


def test_validator_toolkit_check_asks_the_runtime_for_every_gpu() -> None:
    # Upstream's toolkit-validation sets NVIDIA_VISIBLE_DEVICES=all: nvidia-smi there proves the
    # runtime injects the driver.
    objects = operator_validation.render(make_policy(), make_facts())
    validation = ctr(find(objects, "DaemonSet"), "toolkit-validation")
    assert env_of(validation)["NVIDIA_VISIBLE_DEVICES"] == "all"
