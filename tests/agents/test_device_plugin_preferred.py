"""Preferred allocation: topology-aware for whole GPUs, greedy for replicas and MIG devices."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_operator.agents import plugin_config as pc
from gpu_operator.agents.device_plugin import devices, facts, preferred
from gpu_operator.agents.device_plugin.facts import Link
from gpu_operator.nvml import mock
from gpu_operator.nvml.protocol import TopologyLevel

NOWHERE = Path("/nonexistent-root")


def node(preset: str) -> facts.NodeFacts:
    lib = mock.MockMachine.from_preset(preset).nvml()
    lib.init()
    return facts.collect(lib, driver_root=NOWHERE, sys_root=NOWHERE)


@pytest.fixture(scope="module")
def dgx() -> tuple[devices.Resource, facts.NodeFacts]:
    n = node("dgx-a100")
    (resource,) = devices.build_resources(n, pc.PluginConfig())
    return resource, n


def gpus(resource: devices.Resource, ids: list[str]) -> list[int]:
    by_id = resource.by_id()
    return [by_id[i].gpu for i in ids]


def test_pair_scores_add_pcie_closeness_and_100_per_nvlink_on_the_nvswitch_mock(
    dgx: tuple[devices.Resource, facts.NodeFacts],
) -> None:
    _, n = dgx
    assert preferred.pair_score(n.links, 0, 1) == 50 + 1200  # same PCIe switch
    assert preferred.pair_score(n.links, 0, 2) == 20 + 1200  # same CPU
    assert preferred.pair_score(n.links, 0, 4) == 10 + 1200  # across CPUs
    assert preferred.pair_score(n.links, 0, 0) == 0


def test_two_gpus_come_from_one_pcie_switch(dgx: tuple[devices.Resource, facts.NodeFacts]) -> None:
    resource, n = dgx
    ids = [d.id for d in resource.devices]
    chosen = preferred.preferred_allocation(resource, ids, [], 2, n.links)
    assert gpus(resource, chosen) == [0, 1]


def test_four_gpus_come_from_one_socket(dgx: tuple[devices.Resource, facts.NodeFacts]) -> None:
    resource, n = dgx
    ids = [d.id for d in resource.devices]
    chosen = preferred.preferred_allocation(resource, ids, [], 4, n.links)
    assert sorted(gpus(resource, chosen)) == [0, 1, 2, 3]


def test_required_devices_pull_the_allocation_to_their_neighbours(
    dgx: tuple[devices.Resource, facts.NodeFacts],
) -> None:
    resource, n = dgx
    ids = [d.id for d in resource.devices]
    chosen = preferred.preferred_allocation(resource, ids, [ids[5]], 2, n.links)
    assert sorted(gpus(resource, chosen)) == [4, 5]


def test_the_best_partition_keeps_good_pairs_for_later_requests(
    dgx: tuple[devices.Resource, facts.NodeFacts],
) -> None:
    resource, n = dgx
    # GPUs 0, 2, 3 and 5 are free: pairing 2+3 (one switch) leaves 0+5 for the next request.
    ids = [resource.devices[i].id for i in (0, 2, 3, 5)]
    chosen = preferred.preferred_allocation(resource, ids, [], 2, n.links)
    assert sorted(gpus(resource, chosen)) == [2, 3]


def test_nvlinks_outweigh_pcie_distance() -> None:
    links = {
        (0, 1): Link(TopologyLevel.SINGLE, 0),
        (0, 2): Link(TopologyLevel.SYSTEM, 4),
        (1, 2): Link(TopologyLevel.SYSTEM, 0),
    }
    links.update({(b, a): v for (a, b), v in list(links.items())})
    assert preferred.aligned(links, [0, 1, 2], [0], 2) == [0, 2]
    assert preferred.aligned(links, [0, 1, 2], [1], 2) == [0, 1]


def test_aligned_handles_sizes_the_gpus_do_not_divide(
    dgx: tuple[devices.Resource, facts.NodeFacts],
) -> None:
    _, n = dgx
    chosen = preferred.aligned(n.links, list(range(8)), [], 3)
    assert len(chosen) == 3
    assert None not in chosen
    assert preferred.aligned(n.links, [0, 1], [], 3) == []
    assert preferred.aligned(n.links, [0, 1, 2], [], 1) == [0]
    assert preferred.aligned(n.links, [0, 1, 2], [2], 1) == [2]


def test_huge_searches_fall_back_to_the_best_single_set() -> None:
    links = {(a, b): Link(TopologyLevel.SYSTEM, 0) for a in range(16) for b in range(16) if a != b}
    links[(7, 9)] = links[(9, 7)] = Link(TopologyLevel.SINGLE, 2)
    assert sorted(preferred.aligned(links, list(range(16)), [], 2)) == [7, 9]


def replicas(n_gpus: int, per_gpu: int) -> devices.Resource:
    base = [
        devices.Device(f"GPU-{i}", f"GPU-{i}", str(i), i, (f"/dev/nvidia{i}",), 1024, "8.0")
        for i in range(n_gpus)
    ]
    return devices.Resource(
        "nvidia.com/gpu", tuple(devices.replicate(base, per_gpu)), pc.SharingStrategy.TIME_SLICING
    )


def test_distributed_spreads_replicas_over_the_least_used_gpus() -> None:
    r = replicas(3, 4)
    free = [d.id for d in r.devices if d.id not in ("GPU-0::0", "GPU-0::1", "GPU-1::0")]
    chosen = preferred.preferred_allocation(r, free, [], 2, {})
    assert [devices.physical_id(i) for i in chosen] == ["GPU-2", "GPU-1"]


def test_packed_fills_the_busiest_gpu_first() -> None:
    r = replicas(3, 4)
    free = [d.id for d in r.devices if d.id not in ("GPU-1::0",)]
    chosen = preferred.preferred_allocation(r, free, [], 3, {}, "packed")
    assert [devices.physical_id(i) for i in chosen] == ["GPU-1", "GPU-1", "GPU-1"]


def test_distributed_tie_break_spreads_one_request_over_gpus() -> None:
    r = replicas(2, 4)
    chosen = preferred.preferred_allocation(r, [d.id for d in r.devices], [], 2, {})
    assert sorted(devices.physical_id(i) for i in chosen) == ["GPU-0", "GPU-1"]


def test_greedy_keeps_required_ids_first_and_refuses_too_few() -> None:
    r = replicas(2, 2)
    ids = [d.id for d in r.devices]
    chosen = preferred.preferred_allocation(r, ids, ["GPU-1::1"], 2, {})
    assert chosen[0] == "GPU-1::1"
    assert devices.physical_id(chosen[1]) == "GPU-0"
    with pytest.raises(preferred.PreferenceError, match="not enough available devices"):
        preferred.preferred_allocation(r, ids[:1], [], 2, {})


def test_mig_devices_are_picked_greedily() -> None:
    n = node("dgx-a100-mig-mixed")
    resources = devices.build_resources(n, pc.parse({"flags": {"migStrategy": "mixed"}}))
    small = next(r for r in resources if r.name == "nvidia.com/mig-1g.5gb")
    chosen = preferred.preferred_allocation(small, [d.id for d in small.devices], [], 3, n.links)
    assert len(set(chosen)) == 3


def test_unknown_ids_are_an_error() -> None:
    r = replicas(1, 2)
    with pytest.raises(preferred.PreferenceError, match="unknown device: GPU-9"):
        preferred.preferred_allocation(r, ["GPU-9"], [], 1, {})
