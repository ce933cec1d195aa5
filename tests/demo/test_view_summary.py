"""The demo's closing summary tells what the ClusterPolicy adds to "ready": coexistence findings and
nodes waiting at the startup gate, read from its Ready condition."""

from __future__ import annotations

import io
from typing import Any

from rich.console import Console

from gpu_operator.api import crds, keys
from gpu_operator.nvml import machines
from gpudemo import view
from kubesim.store import Store

POLICIES = "clusterpolicies.nvidia.com"
# The fields the CRD requires (each may be empty).
REQUIRED = ("operator", "daemonsets", "driver", "toolkit", "devicePlugin", "dcgmExporter", "dcgm",
            "nodeStatusExporter", "gfd")  # fmt: skip
SPEC: dict[str, Any] = {key: {} for key in REQUIRED}
FINDING = "coexistence: managed-driver on 2 node(s) (t4-1, t4-2): adapt (see node events)"


def _store(*policies: dict[str, Any]) -> Store:
    store = Store()
    store.create(crds.all_crds()["nvidia.com_clusterpolicies.yaml"])
    for policy in policies:
        created = store.create(policy)
        store.update({**created, "status": policy["status"]}, status=True)
    return store


def _policy(name: str, state: str, message: str) -> dict[str, Any]:
    return {
        "apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "metadata": {"name": name},
        "spec": SPEC,
        "status": {"state": state, "conditions": [{"type": "Ready", "message": message}]},
    }  # fmt: skip


def test_the_summary_shows_the_active_policys_notes() -> None:
    store = _store(
        _policy("old", "ignored", "ignored; another policy is active"),
        _policy("cluster-policy", "ready", f"all operand states ready on 2 GPU node(s); {FINDING}"),
    )
    summary = view.Summary(0, 0, {}, {}, 0, 0, 1.0, [], [], policy_notes=view._policy_notes(store))
    assert summary.policy_notes == FINDING
    assert f"  policy notes:     {FINDING}" in view.summary_lines(summary)


def test_a_plain_ready_policy_adds_no_line() -> None:
    store = _store(_policy("cluster-policy", "ready", "all operand states ready on 2 GPU node(s)"))
    assert view._policy_notes(store) == ""
    summary = view.Summary(0, 0, {}, {}, 0, 0, 1.0, [], [])
    assert not [line for line in view.summary_lines(summary) if "policy notes" in line]


# ----- the demo's words and numbers -----------------------------------------------------------

GFD_ANNOTATION = "nvidia.com/gpu-operator.owned-labels"
CONTAINER_STACK = {
    f"nvidia.com/gpu.deploy.{op}": "true"
    for op in ("driver", "container-toolkit", "operator-validator", "device-plugin",
               "gpu-feature-discovery", "dcgm-exporter")
}  # fmt: skip
VM_PASSTHROUGH_STACK = {
    f"nvidia.com/gpu.deploy.{op}": "true"
    for op in ("sandbox-device-plugin", "sandbox-validator", "vfio-manager")
}


def _nodes(*nodes: tuple[str, dict[str, str]]) -> Store:
    store = _store()
    for name, labels in nodes:
        store.create(
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}
        )
    return store


def _row(name: str, product: str = "") -> view.NodeRow:
    return view.NodeRow(name, True, product, 4 if product else 0, "-")


def test_the_progress_line_says_whose_labels_it_counts() -> None:
    # Driver pods run long before GFD labels a node: the operator and NFD labelled it already,
    # so "GPU nodes labelled 0/2" would be wrong.
    snap = view.Snapshot(3.0, ["driver"], [_row("t4-1"), _row("t4-2", "Tesla-T4")], "notReady",
                         "", 2, 4, False)  # fmt: skip
    line = view.progress_line(snap)
    assert "GFD labels on 1/2 GPU nodes" in line
    assert "GPU nodes labelled" not in line


def test_a_vm_labelled_node_running_the_container_stack_is_no_vm_node_and_is_warned_about() -> None:
    # Sandbox workloads off: the operator deploys the container stack whatever the label asks.
    store = _nodes(
        ("passthrough-1", {keys.GPU_WORKLOAD_CONFIG: "vm-passthrough", **CONTAINER_STACK,
                           keys.GPU_PRODUCT: "NVIDIA-A100-SXM4-40GB", "nvidia.com/gpu.count": "8"}),
        ("t4-1", {**CONTAINER_STACK, keys.GPU_PRODUCT: "Tesla-T4", "nvidia.com/gpu.count": "4"}),
    )  # fmt: skip
    snap = view.snapshot(store, "gpu-operator", "cluster-policy", 1.0, {"passthrough-1", "t4-1"})
    summary = view.summarize(store, snap, GFD_ANNOTATION)
    assert summary.vm_nodes == {}
    assert summary.vm_asked_containers == ["passthrough-1"]
    lines = view.summary_lines(summary)
    assert not [line for line in lines if "VM nodes:" in line]
    assert lines[-1] == (
        "warning: passthrough-1 asks for a VM workload (nvidia.com/gpu.workload.config) but "
        "sandbox workloads are off (sandboxWorkloads.enabled=false): the GPUs there go to "
        "containers"
    )


def test_gpus_of_vm_nodes_count_from_their_machines() -> None:
    # GFD does not run on VM nodes: their GPUs come from the fleet's machines.
    store = _nodes(
        ("passthrough-1", {keys.GPU_WORKLOAD_CONFIG: "vm-passthrough", **VM_PASSTHROUGH_STACK}),
        ("t4-1", {**CONTAINER_STACK, keys.GPU_PRODUCT: "Tesla-T4", "nvidia.com/gpu.count": "4"}),
        ("cpu-1", {}),
    )
    hardware = {
        "passthrough-1": view.machine_gpus(machines.preset("dgx-a100")),
        "t4-1": view.machine_gpus(machines.preset("t4x4")),
    }
    snap = view.snapshot(store, "gpu-operator", "cluster-policy", 1.0, set(hardware))
    summary = view.summarize(store, snap, GFD_ANNOTATION, hardware)
    assert summary.gpus_by_model == {"NVIDIA-A100-SXM4-40GB": 8, "Tesla-T4": 4}
    assert summary.vm_nodes == {"vm-passthrough": 1}
    lines = view.summary_lines(summary)
    assert (
        "  GPUs by model:    8 x NVIDIA-A100-SXM4-40GB, 4 x Tesla-T4 (12 in all; 8 on GPU nodes "
        "without GFD labels, counted from their machines)"
    ) in lines
    assert "  VM nodes:         1 vm-passthrough" in lines


def test_machine_gpus_are_named_as_gfd_names_the_product() -> None:
    assert view.machine_gpus(machines.preset("a30x4")) == {"NVIDIA-A30": 4}
    assert view.machine_gpus(machines.preset("t4x4")) == {"Tesla-T4": 4}


def _rendered(snap: view.Snapshot) -> str:
    buffer = io.StringIO()
    Console(file=buffer, width=250, color_system=None).print(view.table(snap, "demo"))
    return buffer.getvalue()


def test_the_simulated_operand_note_shows_only_with_a_simulated_column() -> None:
    real = view.Snapshot(1.0, ["driver", "gfd"], [_row("t4-1", "Tesla-T4")], "ready", "", 2, 2,
                         True)  # fmt: skip
    assert "simulated operand" not in _rendered(real)
    simulated = view.Snapshot(1.0, ["driver", "vgpu-manager"], [_row("t4-1", "Tesla-T4")],
                              "ready", "", 2, 2, True)  # fmt: skip
    text = _rendered(simulated)
    assert "vgpu-manager*" in text
    assert "* simulated operand" in text


def _slice(node: str, driver: str, kinds: list[str]) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{driver}"},
        "spec": {
            "driver": driver, "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {"name": f"d{i}", "attributes": {"type": {"string": kind}}}
                for i, kind in enumerate(kinds)
            ],
        },
    }  # fmt: skip


def test_dra_devices_are_counted_by_type_for_the_gpu_driver_only() -> None:
    """A GPUCluster's demo has no allocatable nvidia.com/gpu: the summary says what the GPU DRA
    driver published instead (other drivers' devices are not GPUs of ours)."""
    store = Store()
    store.create(_slice("a100-mig-1", "gpu.nvidia.com", ["gpu", "gpu", "mig", "mig", "mig"]))
    store.create(_slice("t4-1", "gpu.nvidia.com", ["gpu"]))
    store.create(_slice("t4-1", "compute-domain.nvidia.com", ["channel", "daemon"]))
    devices, nodes = view._dra_devices(store)
    assert (devices, nodes) == ({"gpu": 3, "mig": 3}, 2)
    summary = view.Summary(0, 0, {}, {}, 0, 0, 1.0, [], [], dra_devices=devices, dra_nodes=nodes)
    line = "  DRA devices:      3 gpu, 3 mig in ResourceSlices of 2 nodes (gpu.nvidia.com)"
    assert line in view.summary_lines(summary)
    plain = view.Summary(0, 0, {}, {}, 0, 0, 1.0, [], [])
    assert not [text for text in view.summary_lines(plain) if "DRA devices" in text]
