"""The `nvl72` fleet: two GB200 NVL72 racks of 18 four-GPU trays, one cluster UUID per rack,
arm64 nodes; and the `rack:` pool field's checks."""

from __future__ import annotations

import pytest

from gpu_operator.nvml import machines, mock
from gpudemo import fleet


def test_nvl72_fleet_is_two_racks_with_their_own_cluster_uuids() -> None:
    nvl72 = fleet.resolve("nvl72")
    racks = [p for p in nvl72.pools if p.rack is not None]
    assert [(p.count, p.gpus_per_node) for p in racks] == [(18, 4), (18, 4)]
    uuids = {p.rack.cluster_uuid for p in racks if p.rack is not None}
    assert len(uuids) == 2
    plans = [n for n in fleet.plan_nodes(nvl72) if n.pool.rack is not None]
    assert len(plans) == 36
    assert plans[0].name == "rack-a-1"
    assert plans[0].node_info["architecture"] == "arm64"
    assert plans[0].labels["kubernetes.io/arch"] == "arm64"
    for pool in racks:
        spec = pool.machine_spec()
        assert spec is not None
        lib = mock.MockMachine(spec).nvml()
        lib.init()
        info = lib.device_by_index(0).fabric_info()
        assert pool.rack is not None
        assert (info.cluster_uuid, info.clique_id) == (pool.rack.cluster_uuid, 32766)


@pytest.mark.parametrize(
    ("pool", "message"),
    [
        ({"machine": "dgx-h100", "rack": {"clusterUuid": "6a1c3f2e-0b7d-4e59-9c21-72a8d4f0a001"}},
         "rack: machine dgx-h100 has no multi-node NVLink fabric"),
        ({"machine": "gb200-nvl72", "count": 19,
          "rack": {"clusterUuid": "6a1c3f2e-0b7d-4e59-9c21-72a8d4f0a001"}},
         "an NVL72 rack holds 18 compute trays"),
        ({"machine": "gb300-nvl72", "rack": {"clusterUuid": "rack-a"}}, "clusterUuid"),
    ],
)  # fmt: skip
def test_bad_rack_pools_name_the_problem(pool: dict[str, object], message: str) -> None:
    with pytest.raises(fleet.FleetError, match=message):
        fleet.parse({"pools": [{"name": "r", **pool}]}, "racks.yaml")


def test_rack_trays_show_no_local_nvswitch_on_the_pci_bus() -> None:
    from simhost import hardware

    tray = mock.MockMachine(machines.preset("gb200-nvl72"))
    assert not [f for f in hardware.pci_functions(tray) if f.device == 0x22A3]
