"""The hand-over rule (pure): nothing published while a device plugin offers NVIDIA resources
on the node; afterwards every GPU a device-plugin container still holds is left out."""

from __future__ import annotations

from dataclasses import replace

from gpu_operator.agents.dra_kubelet_plugin import handover
from gpu_operator.agents.dra_kubelet_plugin.inventory import GpuInfo, Inventory, MigInfo


def gpu(index: int, **kw: object) -> GpuInfo:
    return GpuInfo(
        index=index,
        minor=index,
        uuid=f"GPU-{index}",
        product_name="NVIDIA A100-SXM4-40GB",
        brand="Nvidia",
        architecture="Ampere",
        cuda_compute_capability="8.0",
        pci_bus_id=f"0000:0{index}:00.0",
        memory_bytes=40 << 30,
        **kw,  # type: ignore[arg-type]
    )


MIG = MigInfo("MIG-1", "1g.5gb", 1, 0, 19, 0, 1, 14, 1, 0, 0, 0, 0, 5 << 30)
INV = Inventory(
    driver_version="580.82.07",
    cuda_driver_version="13.0",
    gpus=(gpu(0), gpu(1), replace(gpu(2), mig_enabled=True, migs=(MIG,))),
    node=None,  # type: ignore[arg-type]
)


def test_a_device_plugin_still_offering_gpus_blocks_publishing() -> None:
    got = handover.decide("n1", {"nvidia.com/gpu": "8", "cpu": "4"}, [], INV)
    assert got.blocked is not None
    assert "nvidia.com/gpu=8" in got.blocked
    assert "node n1" in got.blocked
    assert "gpu.deploy.device-plugin=false" in got.blocked


def test_zero_or_other_resources_do_not_block() -> None:
    got = handover.decide("n1", {"nvidia.com/gpu": "0", "example.com/fpga": "2"}, [], INV)
    assert got == handover.Handover(blocked=None, withheld=frozenset(), reasons=())
    assert got.summary is None


def test_held_gpus_replicas_and_mig_devices_are_withheld() -> None:
    held = [
        handover.Held("nvidia.com/gpu", "GPU-0::3", "default/shared"),  # a time-sliced replica
        handover.Held("nvidia.com/mig-1g.5gb", "MIG-1", "ml/train"),
        handover.Held("example.com/fpga", "GPU-1", "x/y"),  # not an NVIDIA resource
    ]
    got = handover.decide("n1", {"nvidia.com/gpu": "0"}, held, INV)
    assert got.blocked is None
    assert got.withheld == {"GPU-0", "GPU-2", "MIG-1"}
    assert got.reasons[0].startswith("GPU 0 (GPU-0) withheld")
    assert "default/shared" in got.reasons[0]
    assert "ml/train" in got.reasons[1]


def test_the_index_strategy_ids_name_gpus_too() -> None:
    got = handover.decide("n1", {}, [handover.Held("nvidia.com/gpu", "1", "a/b")], INV)
    assert got.withheld == {"GPU-1"}
