"""The simulated IMEX daemon: the pure decision (peers' facts -> domain), and the daemon and
`nvidia-imex-ctl` over config files and a registry of simulated NVL72 trays."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from gpu_operator.nvml import machines, mock
from gpu_operator.nvml import protocol as p
from simhost import imex

RACK = "0b6c2d1e-7f3a-4c5b-8d9e-aa00000000aa"
OTHER = "0b6c2d1e-7f3a-4c5b-8d9e-aa00000000bb"


def fabric(cluster: str = RACK, clique: int = 32766, **health: bool) -> tuple[p.FabricInfo, ...]:
    mask = p.fabric_health_mask(**health)
    return tuple(p.FabricInfo(cluster, clique, 3, 0, mask) for _ in range(4))


def hosts(**extra: imex.HostFacts | None) -> dict[str, imex.HostFacts | None]:
    base: dict[str, imex.HostFacts | None] = {
        f"10.0.0.{i}": imex.HostFacts(f"rack-a-{i}", fabric=fabric()) for i in range(1, 5)
    }
    base.update({k.replace("_", "."): v for k, v in extra.items()})
    return base


ADDRESSES = [f"10.0.0.{i}" for i in range(1, 5)]


def test_four_healthy_peers_form_an_up_domain() -> None:
    domain = imex.decide("10.0.0.1", ADDRESSES, hosts())
    assert domain.ready
    assert domain.state == "UP"
    assert domain.clique == f"{RACK}.32766"
    assert [r.link for r in domain.nodes] == ["C"] * 4
    assert domain.problems == ()


def test_an_unreachable_peer_degrades_the_domain_and_is_named() -> None:
    """The local daemon stays ready (`-q` asks only it, as NVIDIA's probe does), the domain
    is DEGRADED, and the problem names the peer and its address."""
    down = imex.HostFacts("rack-a-3", up=False, fabric=fabric())
    domain = imex.decide("10.0.0.1", ADDRESSES, hosts(**{"10_0_0_3": down, "10_0_0_4": None}))
    assert domain.ready
    assert domain.state == "DEGRADED"
    assert [r.status for r in domain.nodes] == ["READY", "READY", "UNAVAILABLE", "UNAVAILABLE"]
    assert domain.problems == (
        "peer rack-a-3 (10.0.0.3) is unreachable: the node is down",
        "peer 10.0.0.4 is unreachable: no node answers at that address",
    )


def test_a_peer_without_a_daemon_never_connected() -> None:
    idle = imex.HostFacts("rack-a-2", daemon=False, fabric=fabric())
    domain = imex.decide("10.0.0.1", ADDRESSES, hosts(**{"10_0_0_2": idle}))
    assert domain.nodes[1].link == "N"
    assert "no IMEX daemon listens on port 50000" in domain.problems[0]


def test_own_degraded_fabric_keeps_the_daemon_from_ready() -> None:
    sick = imex.HostFacts("rack-a-1", fabric=fabric(route_unhealthy=True))
    domain = imex.decide("10.0.0.1", ADDRESSES, hosts(**{"10_0_0_1": sick}))
    assert not domain.ready
    assert domain.state == "DOWN"
    assert domain.problems[0] == "node rack-a-1 GPU 0: NVLink fabric degraded: route unhealthy"


def test_a_peer_with_degraded_fabric_is_reported_degraded() -> None:
    sick = imex.HostFacts("rack-a-2", fabric=fabric(degraded_bandwidth=True))
    domain = imex.decide("10.0.0.1", ADDRESSES, hosts(**{"10_0_0_2": sick}))
    assert domain.state == "DEGRADED"
    assert domain.nodes[1].status == "DEGRADED"
    assert "rack-a-2 GPU 0: NVLink fabric degraded: bandwidth degraded" in domain.problems[0]


def test_unfinished_or_failed_registration_is_named() -> None:
    pending = (p.FabricInfo(RACK, 32766, 2, 0, 0x1AA), p.FabricInfo(RACK, 32766, 3, 10, 0x1AA))
    _, problems = imex.fabric_problems("n", pending)
    assert problems == [
        "node n GPU 0: NVLink fabric registration in progress",
        "node n GPU 1: NVLink fabric registration failed (NVML error 10)",
    ]


def test_a_peer_of_another_rack_is_a_node_map_mismatch() -> None:
    other = imex.HostFacts("rack-b-1", fabric=fabric(OTHER))
    domain = imex.decide("10.0.0.1", ADDRESSES, hosts(**{"10_0_0_2": other}))
    assert domain.nodes[1].link == "!M!"
    assert f"is in clique {OTHER}.32766, not {RACK}.32766" in domain.problems[0]


def test_own_address_missing_from_the_nodes_config() -> None:
    domain = imex.decide("10.0.0.9", ADDRESSES, hosts())
    assert not domain.ready
    assert "this node's address 10.0.0.9 is not in the nodes config" in domain.problems[0]


def test_domain_status_output_lists_nodes_links_and_state() -> None:
    domain = imex.decide("10.0.0.2", ADDRESSES[:2], hosts())
    text = imex.format_domain(domain, hostnames=True)
    assert "Node #0   - 10.0.0.1 (rack-a-1)" in text
    assert "Node #1   - 10.0.0.2 (rack-a-2)" in text
    assert "         1        C   C" in text
    assert text.rstrip().endswith("Domain State: UP")


# ----- the daemon over files and a registry of simulated trays ---------------------------------


def _write(root: Path, addresses: list[str]) -> None:
    (root / "imexd").mkdir(parents=True, exist_ok=True)
    (root / "imexd" / "imexd.cfg").write_text(
        "# IMEX configuration\nSERVER_PORT=50000\nIMEX_NODE_CONFIG_FILE=/imexd/nodes.cfg\n"
    )
    (root / "imexd" / "nodes.cfg").write_text("".join(f"{a}\n" for a in addresses))


@pytest.fixture
def rack() -> tuple[imex.Registry, list[mock.MockMachine]]:
    network = imex.Registry()
    trays = []
    for i in range(1, 5):
        machine = mock.MockMachine(machines.in_rack(machines.preset("gb200-nvl72"), RACK), seed=i)
        network.add(f"10.0.0.{i}", f"rack-a-{i}", machine)
        network.set_daemon(f"rack-a-{i}", True)
        trays.append(machine)
    return network, trays


def test_daemon_reports_ready_through_the_probe_command(
    tmp_path: Path, rack: tuple[imex.Registry, list[mock.MockMachine]]
) -> None:
    network, _ = rack
    _write(tmp_path, ADDRESSES)
    daemon = imex.ImexDaemon("rack-a-1", "10.0.0.1", tmp_path, network)
    assert daemon.ctl(["-c", "/imexd/imexd.cfg", "-q"]) == (0, "READY\n")
    assert imex.check(daemon, f"{RACK}.32766") == (0, "")
    assert imex.check(daemon, "")[0] == 0  # a node outside any clique runs no IMEX daemon
    code, text = daemon.ctl(["-N"])
    assert code == 0
    assert "Domain State: UP" in text


def test_daemon_logs_an_unreachable_peer_once(
    tmp_path: Path,
    rack: tuple[imex.Registry, list[mock.MockMachine]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    network, _ = rack
    _write(tmp_path, ADDRESSES)
    daemon = imex.ImexDaemon("rack-a-1", "10.0.0.1", tmp_path, network)
    network.set_up("rack-a-4", False)
    with caplog.at_level(logging.ERROR, logger="simhost.imex"):
        daemon.status()
        daemon.status()
    errors = [r.getMessage() for r in caplog.records]
    assert errors == [
        "IMEX daemon on rack-a-1: peer rack-a-4 (10.0.0.4) is unreachable: the node is down"
    ]
    assert "Domain State: DEGRADED" in daemon.ctl(["-N"])[1]


def test_daemon_on_a_tray_whose_fabric_degraded_is_not_ready(
    tmp_path: Path, rack: tuple[imex.Registry, list[mock.MockMachine]]
) -> None:
    network, trays = rack
    _write(tmp_path, ADDRESSES)
    trays[0].set_fabric(2, health_mask=p.fabric_health_mask(access_timeout_recovery=True))
    daemon = imex.ImexDaemon("rack-a-1", "10.0.0.1", tmp_path, network)
    code, out = imex.check(daemon, f"{RACK}.32766")
    assert code == 1
    assert "rack-a-1 GPU 2: NVLink fabric degraded: access timeout recovery in progress" in out


def test_daemon_without_its_config_says_which_file(tmp_path: Path) -> None:
    daemon = imex.ImexDaemon("n", "10.0.0.1", tmp_path, imex.Registry())
    code, out = daemon.ctl(["-q"])
    assert code == 1
    assert "/imexd/imexd.cfg: no such file" in out


def test_bad_config_line_names_file_and_line() -> None:
    with pytest.raises(imex.ConfigError, match=r"imexd.cfg:2: expected KEY=value"):
        imex.read_config("A=1\nnonsense\n", "imexd.cfg")


def test_registry_refuses_an_unknown_node() -> None:
    with pytest.raises(KeyError, match="no simulated node 'ghost'"):
        imex.Registry().set_up("ghost", False)
