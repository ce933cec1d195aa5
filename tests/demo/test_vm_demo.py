"""The demo with VM-workload pools: it converges without GFD labels on VM nodes (where GFD does
not run), shows the passthrough and vGPU resources, and names the agents that really ran."""

from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console
from typer.testing import CliRunner

from gpu_operator.api import keys, manifests
from gpu_operator.cli import app
from gpudemo import fleet, programs, session, view

ROOT = Path(__file__).resolve().parents[2]
PASSTHROUGH_FLEET = """pools:
  - name: pt
    machine: dgx-a100
    workload: vm-passthrough
  - name: ctr
    machine: t4x4
    workload: container
"""


def test_the_kubevirt_passthrough_example_finishes(tmp_path: Path) -> None:
    fleet_file = tmp_path / "fleet.yaml"
    fleet_file.write_text(PASSTHROUGH_FLEET)
    result = CliRunner().invoke(
        app,
        [
            "demo", "--fleet", str(fleet_file),
            "--policy", str(ROOT / "examples" / "kubevirt-passthrough.yaml"),
            "--time-scale", "0", "--timeout", "60", "--no-live",
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "nvidia.com/GA100_A100_SXM4_40GB=8" in result.output
    assert "nvidia.com/gpu=4" in result.output
    assert "VM nodes:         1 vm-passthrough" in result.output
    # GFD does not label the VM node: its GPUs are counted from its machine.
    assert (
        "GPUs by model:    8 x NVIDIA-A100-SXM4-40GB, 4 x Tesla-T4 (12 in all; 8 on GPU nodes "
        "without GFD labels, counted from their machines)"
    ) in result.output
    real = next(line for line in result.output.splitlines() if "real agents:" in line)
    assert "vfio-manager" in real
    assert "sandbox-device-plugin" in real


async def test_the_kubevirt_fleet_shows_passthrough_and_vgpu_resources() -> None:
    documents = manifests.read(str(ROOT / "examples" / "kubevirt-vgpu.yaml"))
    policy = next(d for d in documents if d["kind"] == "ClusterPolicy")
    objects = [d for d in documents if d["kind"] == "ConfigMap"]
    # The example's vGPU manager image lives in the user's own registry (it is built from
    # NVIDIA's licensed driver): the simulated one holds it, as the user's would.
    options = session.Options(
        fleet=fleet.NAMED["kubevirt"], policy=policy, objects=objects,
        timing=programs.Timing(scale=0.0), timeout=60.0, live=False,
        images=["registry.example.com/nvidia/*"],
    )  # fmt: skip
    result = await session.run(options, Console(file=io.StringIO(), width=200))
    assert result.converged
    allocatable = result.node_allocatable
    assert allocatable["passthrough-1"]["nvidia.com/GA100_A100_SXM4_40GB"] == "8"
    assert allocatable["vgpu-t4-1"]["nvidia.com/GRID_T4-4Q"] == "16"  # default: 4 x T4-4Q each
    assert allocatable["vgpu-a30-1"]["nvidia.com/NVIDIA_A30-6C"] == "16"
    assert allocatable["containers-1"]["nvidia.com/gpu"] == "4"
    assert "nvidia.com/gpu" not in allocatable["passthrough-1"]
    labels = result.node_labels
    assert labels["vgpu-t4-1"]["nvidia.com/vgpu.config.state"] == "success"
    assert keys.GPU_PRODUCT not in labels["passthrough-1"]
    assert result.summary is not None
    assert result.summary.vm_nodes == {"vm-passthrough": 1, "vm-vgpu": 2}


def _row(**kw: object) -> view.NodeRow:
    base: dict[str, object] = {
        "name": "n", "gpu_node": True, "product": "", "gpu_count": 0, "allocatable": "-",
    }  # fmt: skip
    base.update(kw)
    return view.NodeRow(**base)  # type: ignore[arg-type]


def _converged(*rows: view.NodeRow) -> bool:
    snap = view.Snapshot(0.0, [], list(rows), "ready", "", 1, 1, True)
    return snap.converged


def test_vm_nodes_converge_without_gfd_labels_but_container_nodes_need_them() -> None:
    vm = _row(needs_gfd=False, needs_allocatable=False, workload="vm-passthrough")
    assert _converged(vm)
    assert not _converged(vm, _row())  # a container node without GFD labels
    assert _converged(vm, _row(product="Tesla-T4", allocatable="4 gpu"))
    assert not _converged(_row(product="Tesla-T4"))  # labelled but nothing advertised
    assert view._gpus(vm) == "(vm-passthrough)"
