"""Fleet pools and the NVIDIA driver: who brings it (`driver: operator | preinstalled`), its
version, Secure Boot, the `aks-preinstalled` fleet, and installs that turn the operator's driver
off (their GPU pools then bring their own)."""

from __future__ import annotations

import copy
import io
from pathlib import Path

import pytest
from rich.console import Console

from gpudemo import fit, fleet, session


def test_the_aks_fleet_has_two_gpu_nodes_with_a_preinstalled_driver_and_a_cpu_node() -> None:
    aks = fleet.NAMED["aks-preinstalled"]
    gpu = [p for p in aks.pools if p.machine is not None]
    assert [(p.count, p.host_driver) for p in gpu] == [(2, fleet.DEFAULT_HOST_DRIVER)]
    assert aks.node_count == 3
    assert "preinstalled driver 570.195.03" in fleet.describe(aks)[0]


def test_pools_default_to_the_operators_driver_without_secure_boot() -> None:
    pool = fleet.parse({"pools": [{"name": "a", "machine": "t4x4"}]}).pools[0]
    assert (pool.driver, pool.host_driver, pool.secure_boot) == ("operator", None, False)


def test_a_preinstalled_pool_may_name_its_driver_version() -> None:
    pool = fleet.parse(
        {"pools": [{"name": "a", "machine": "t4x4", "driver": "preinstalled",
                    "driverVersion": "550.127.05", "secureBoot": True}]}
    ).pools[0]  # fmt: skip
    assert pool.host_driver == "550.127.05"
    assert pool.secure_boot


@pytest.mark.parametrize(
    ("pool", "message"),
    [
        ({"driver": "preinstalled"}, "pools.0: driver: preinstalled needs a GPU machine"),
        ({"machine": "t4x4", "driverVersion": "550.54.15"},
         "pools.0: driverVersion: only for driver: preinstalled"),
        ({"machine": "t4x4", "driver": "preinstalled", "driverVersion": "5.1"},
         "pools.0.driverVersion: '5.1' is not an NVIDIA driver version"),
        ({"machine": "t4x4", "driver": "host"},
         "pools.0.driver: Input should be 'operator' or 'preinstalled'"),
        ({"machine": "a30x4", "driver": "preinstalled", "workload": "vm-vgpu"},
         "cannot serve workload vm-vgpu"),
    ],
)  # fmt: skip
def test_bad_driver_fields_name_the_pool_and_field(pool: dict[str, object], message: str) -> None:
    with pytest.raises(fleet.FleetError, match=r"^f\.yaml: ") as raised:
        fleet.parse({"pools": [{"name": "a", **pool}]}, "f.yaml")
    assert message in str(raised.value)


def test_an_install_without_the_operators_driver_is_recognised(tmp_path: Path) -> None:
    off = copy.deepcopy(session.DEFAULT_POLICY)
    off["spec"]["driver"] = {"enabled": False}
    assert fit.driver_disabled(off)
    assert not fit.driver_disabled(session.DEFAULT_POLICY)
    first, second = tmp_path / "a.yaml", tmp_path / "b.yaml"
    first.write_text("driver:\n  enabled: false\n")
    second.write_text("driver:\n  enabled: true\n")
    assert fit.driver_disabled(None, [first])
    assert not fit.driver_disabled(None, [first, second])  # the last values file wins
    assert not fit.driver_disabled(None, [tmp_path / "missing.yaml"])


def test_without_the_operators_driver_the_container_gpu_pools_bring_their_own() -> None:
    off = copy.deepcopy(session.DEFAULT_POLICY)
    off["spec"]["driver"] = {"enabled": False}
    options = session.Options(fleet=fleet.NAMED["kubevirt"], policy=off)
    out = io.StringIO()
    fitted = fit.fit_fleet(options, Console(file=out, width=200))
    drivers = {p.name: p.driver for p in fitted.fleet.pools}
    assert drivers == {
        "passthrough": "operator", "vgpu-t4": "operator", "vgpu-a30": "operator",
        "containers": "preinstalled", "cpu": "operator",
    }  # fmt: skip
    assert "GPU pools containers come with a preinstalled driver" in out.getvalue()


def test_with_the_operators_driver_the_fleet_is_left_as_it_is() -> None:
    options = session.Options(fleet=fleet.NAMED["small"])
    assert fit.fit_fleet(options, Console(file=io.StringIO())).fleet == fleet.NAMED["small"]


def test_a_pool_with_a_preinstalled_580_driver_has_nvml_report_580() -> None:
    """The machine emulates the pool's host driver: its NVML, nvidia-smi and MIG profiles follow
    the 580 branch even before (or without) the host's loaded driver is probed."""
    from gpu_operator.nvml import mock

    pool = fleet.parse(
        {"pools": [{"name": "a", "machine": "dgx-a100", "driver": "preinstalled",
                    "driverVersion": "580.95.05"}]}
    ).pools[0]  # fmt: skip
    spec = pool.machine_spec()
    assert spec is not None
    assert (spec.driver_version, spec.cuda_driver_version) == ("580.95.05", 13000)
    assert spec.driver_branch == 580
    lib = mock.MockMachine(spec).nvml()
    lib.init()
    try:
        assert lib.driver_version() == "580.95.05"
        assert lib.cuda_driver_version() == 13000
        assert lib.nvml_version() == "13.580.95.05"
    finally:
        lib.shutdown()
    # A pool of the operator's driver keeps the machine's own (the driver image decides).
    plain = fleet.parse({"pools": [{"name": "a", "machine": "dgx-a100"}]}).pools[0].machine_spec()
    assert plain is not None
    assert plain.driver_version == "550.54.15"


async def test_the_demo_builds_the_dra_fleets_machines_with_their_580_driver() -> None:
    import kubesim
    from gpudemo import helm_session, programs

    options = session.Options(fleet=fleet.NAMED["dra"], timing=programs.Timing(scale=0.0))
    demo = session.Demo(options, Console(file=io.StringIO()))
    async with kubesim.Cluster(kubelet=session.kubelet_config(options)) as sim:
        nodes = helm_session.prepare(sim, demo)
        machines = {n: s.machine for n, s in nodes.nodes.items() if s.machine is not None}
        assert sorted(machines) == ["a100-mig-1", "t4-1"]
        for name, machine in machines.items():
            assert machine.spec.driver_version == fleet.DRA_HOST_DRIVER, name
            machine.driver_probe = None  # what the machine itself emulates, not the host files
            lib = machine.nvml()
            lib.init()
            try:
                assert lib.driver_version() == fleet.DRA_HOST_DRIVER, name
                assert lib.nvml_version().endswith(fleet.DRA_HOST_DRIVER), name
            finally:
                lib.shutdown()
