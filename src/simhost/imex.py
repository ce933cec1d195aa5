"""A simulated IMEX daemon (`nvidia-imex`) and its control tool (`nvidia-imex-ctl`) on the
simulated node host.

On an NVL72 rack, GPUs of different nodes share memory over NVLink only between nodes whose IMEX
daemons know each other: each daemon reads a nodes config (one peer address per line, its own
included), connects to every peer's daemon, and answers `nvidia-imex-ctl` on its command port.
NVIDIA's ComputeDomain daemon pod renders that config (`/imexd/imexd.cfg`, peers in
`/imexd/nodes.cfg`) and its readiness, startup and liveness probes run `compute-domain-daemon
check`, which runs `nvidia-imex-ctl -c /imexd/imexd.cfg -q` and passes only on the exact output
`READY\\n`. That query asks the local daemon only; `-N` shows the whole domain.

`decide` is the pure part: the local node's and its peers' facts in, the domain's state out.
`ImexDaemon` is the thin I/O around it: it reads the two config files, looks the peers up in
a `Network` (the simulated hosts that answer at an address: `Registry`), logs what it found,
and formats the control tool's answers. Facts: docs/compute-domains.md.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

from gpu_operator import nvml
from gpu_operator.nvml import mock
from gpu_operator.nvml import protocol as p

log = logging.getLogger(__name__)

# Where NVIDIA's ComputeDomain daemon writes the IMEX configuration in its pod, and the
# defaults of a host install (the nvidia-imex package).
DAEMON_CONFIG = "/imexd/imexd.cfg"
DAEMON_NODES_CONFIG = "/imexd/nodes.cfg"
HOST_CONFIG = "/etc/nvidia-imex/config.cfg"
HOST_NODES_CONFIG = "/etc/nvidia-imex/nodes_config.cfg"
SERVER_PORT = 50000  # peers connect here
CMD_PORT = 50005  # nvidia-imex-ctl connects here
READY = "READY\n"
EXIT_OK = 0
EXIT_NOT_READY = 1
EXIT_USAGE = 2

DomainState = Literal["UP", "DEGRADED", "DOWN"]
# One connectivity-table cell, as nvidia-imex-ctl -N prints it: C connected, N never connected,
# I invalid (the node did not answer: no status), !M! the peer is in another NVLink partition.
Link = Literal["C", "N", "I", "!M!"]


@dataclass(frozen=True)
class HostFacts:
    """What answers at an address: the node, whether it is up, whether an IMEX daemon runs
    on it, and its GPUs' fabric registration (NVML's fabric info, or the NVML error text)."""

    node: str
    up: bool = True
    daemon: bool = True
    fabric: tuple[p.FabricInfo | str, ...] = ()


@dataclass(frozen=True)
class NodeStatus:
    """One row of the domain status: the address from the nodes config and what it is."""

    index: int
    address: str
    node: str | None
    status: Literal["READY", "UNAVAILABLE", "DEGRADED"]
    link: Link
    reason: str = ""


@dataclass(frozen=True)
class Domain:
    """The decision: whether the local daemon is ready, the domain's state, every node's row,
    and the problems to log (empty when all is well)."""

    ready: bool
    state: DomainState
    clique: str | None
    nodes: tuple[NodeStatus, ...]
    problems: tuple[str, ...] = ()
    own: int | None = None  # this node's index in the nodes config


def fabric_problems(
    node: str, fabric: Sequence[p.FabricInfo | str]
) -> tuple[str | None, list[str]]:
    """The node's clique (`<clusterUuid>.<cliqueId>`, None when its GPUs are in none) and what
    keeps its fabric from IMEX use: a GPU not registered, a failed registration, unhealthy
    links, GPUs of one node in different cliques."""
    problems: list[str] = []
    cliques: set[str] = set()
    for index, info in enumerate(fabric):
        where = f"node {node} GPU {index}"
        if isinstance(info, str):
            problems.append(f"{where}: no fabric info ({info})")
            continue
        if info.state != p.FABRIC_STATE_COMPLETED:
            states = {0: "not supported", 1: "not started", 2: "in progress"}
            what = states.get(info.state, f"state {info.state}")
            problems.append(f"{where}: NVLink fabric registration {what}")
            continue
        if info.status != 0:
            problems.append(
                f"{where}: NVLink fabric registration failed (NVML error {info.status})"
            )
            continue
        cliques.add(f"{info.cluster_uuid}.{info.clique_id}")
        faults = info.unhealthy()
        if faults:
            problems.append(f"{where}: NVLink fabric degraded: {', '.join(faults)}")
    if len(cliques) > 1:
        problems.append(f"node {node}: its GPUs are in different cliques: {sorted(cliques)}")
    if not fabric:
        problems.append(f"node {node}: no GPU attached to an NVLink fabric")
    clique = next(iter(cliques)) if len(cliques) == 1 else None
    return clique, problems


def decide(own: str, addresses: Sequence[str], hosts: Mapping[str, HostFacts | None]) -> Domain:
    """The domain as the daemon at address `own` sees it: `addresses` is its nodes config in
    order, `hosts` what answers at each address (None: nothing does).

    The local daemon is ready when its own address is in the config and its own GPUs are
    registered with the fabric, healthy and in one clique. The domain is UP when every peer's
    daemon is connected, in the same clique and healthy; DEGRADED when the local daemon is
    ready but a peer is not; DOWN when the local daemon is not ready."""
    problems: list[str] = []
    if own not in addresses:
        listed = ", ".join(addresses) or "no addresses"
        problems.append(
            f"this node's address {own} is not in the nodes config ({listed}): no address to "
            "bind to; the daemon cannot start"
        )
    me = hosts.get(own)
    own_clique: str | None = None
    if me is not None:
        own_clique, own_faults = fabric_problems(me.node, me.fabric)
        problems += own_faults
    elif own in addresses:
        problems.append(f"no host answers at this node's own address {own}")
    ready = not problems
    rows: list[NodeStatus] = []
    peers_ok = True
    for index, address in enumerate(addresses):
        host = hosts.get(address)
        if address == own:
            rows.append(
                NodeStatus(
                    index,
                    address,
                    me.node if me else None,
                    "READY" if ready else "UNAVAILABLE",
                    "C" if ready else "I",
                )
            )
            continue
        row = _peer_row(index, address, host, own_clique)
        if row.reason:
            peers_ok = False
            problems.append(row.reason)
        rows.append(row)
    state: DomainState = "DOWN" if not ready else "UP" if peers_ok else "DEGRADED"
    own_index = addresses.index(own) if own in addresses else None
    return Domain(ready, state, own_clique, tuple(rows), tuple(problems), own_index)


def _peer_row(index: int, address: str, host: HostFacts | None, clique: str | None) -> NodeStatus:
    if host is None:
        return NodeStatus(
            index,
            address,
            None,
            "UNAVAILABLE",
            "I",
            f"peer {address} is unreachable: no node answers at that address",
        )
    name = f"peer {host.node} ({address})"
    if not host.up:
        return NodeStatus(
            index,
            address,
            host.node,
            "UNAVAILABLE",
            "I",
            f"{name} is unreachable: the node is down",
        )
    if not host.daemon:
        return NodeStatus(
            index,
            address,
            host.node,
            "UNAVAILABLE",
            "N",
            f"{name} is unreachable: no IMEX daemon listens on port {SERVER_PORT}",
        )
    peer_clique, faults = fabric_problems(host.node, host.fabric)
    if clique is not None and peer_clique is not None and peer_clique != clique:
        return NodeStatus(
            index,
            address,
            host.node,
            "UNAVAILABLE",
            "!M!",
            f"{name} is in clique {peer_clique}, not {clique}: GPUs of different "
            "NVLink partitions cannot share memory",
        )
    if faults:
        return NodeStatus(
            index, address, host.node, "DEGRADED", "C", f"{name}: " + "; ".join(faults)
        )
    return NodeStatus(index, address, host.node, "READY", "C")


def format_domain(domain: Domain, *, hostnames: bool = False) -> str:
    """`nvidia-imex-ctl -N`: the nodes with their status, the connectivity from this node,
    and the domain state (`-H` adds the node names)."""
    lines = [
        "Connectivity Table Legend:",
        "I - Invalid - Node wasn't reachable, no connection status available",
        "N - Never Connected",
        "!M! - Node map mismatch, communication disabled.",
        "C - Connected - Ready for operation",
        "",
        "Nodes:",
    ]
    for row in domain.nodes:
        name = f" ({row.node})" if hostnames and row.node else ""
        lines.append(f"Node #{row.index:<3} - {row.address + name:<32} - {row.status}")
    lines += ["", " Nodes From\\To  " + " ".join(f"{r.index:>3}" for r in domain.nodes)]
    if domain.own is not None:
        cells = " ".join(f"{r.link:>3}" for r in domain.nodes)
        lines.append(f"       {domain.own:>3}      {cells}")
    lines += ["", f"Domain State: {domain.state}", ""]
    return "\n".join(lines)


# ----- the I/O around `decide` ------------------------------------------------------------------


class Network(Protocol):
    """The simulated hosts reachable from a node, by address (an IP or a DNS name)."""

    def lookup(self, address: str) -> HostFacts | None: ...


def machine_fabric(machine: mock.MockMachine | None) -> tuple[p.FabricInfo | str, ...]:
    """Each GPU's fabric info as the node's NVML reports it (the error text where it fails)."""
    if machine is None:
        return ()
    lib = machine.nvml()
    try:
        lib.init()
    except nvml.NvmlError as err:
        return (f"NVML: {err}",)
    infos: list[p.FabricInfo | str] = []
    for index in range(lib.device_count()):
        try:
            infos.append(lib.device_by_index(index).fabric_info())
        except nvml.NvmlError as err:
            infos.append(str(err))
    return tuple(infos)


@dataclass
class _Host:
    node: str
    machine: mock.MockMachine | None
    up: bool = True
    daemon: bool = False


@dataclass
class Registry:
    """The simulated nodes by address, with whether each is up and runs an IMEX daemon; the
    fabric facts are read from each node's mock GPUs at lookup time."""

    hosts: dict[str, _Host] = field(default_factory=dict)

    def add(self, address: str, node: str, machine: mock.MockMachine | None) -> None:
        self.hosts[address] = _Host(node, machine)

    def set_up(self, node: str, up: bool) -> None:
        for host in self._of(node):
            host.up = up

    def set_daemon(self, node: str, running: bool) -> None:
        for host in self._of(node):
            host.daemon = running

    def _of(self, node: str) -> list[_Host]:
        found = [h for h in self.hosts.values() if h.node == node]
        if not found:
            raise KeyError(f"no simulated node {node!r} in the IMEX network")
        return found

    def lookup(self, address: str) -> HostFacts | None:
        host = self.hosts.get(address)
        if host is None:
            return None
        return HostFacts(host.node, host.up, host.daemon, machine_fabric(host.machine))


class ConfigError(ValueError):
    """An IMEX configuration the daemon cannot use; the message names the file and key."""


def read_config(text: str, source: str) -> dict[str, str]:
    """`KEY=value` lines (comments and blanks skipped), as the daemon reads its config."""
    values: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{source}:{number}: expected KEY=value, got {line!r}")
        values[key.strip()] = value.strip()
    return values


def read_nodes(text: str) -> list[str]:
    """The nodes config: one peer address per line, in order (the index is the node number)."""
    return [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]


class ImexDaemon:
    """The simulated `nvidia-imex -c <config>` of node `node`, reachable at `address`; its
    root is the directory the config paths are relative to (the pod's or host's `/`)."""

    def __init__(
        self, node: str, address: str, root: Path, network: Network, config: str = DAEMON_CONFIG
    ) -> None:
        self.node = node
        self.address = address
        self.root = root
        self.network = network
        self.config = config
        self._logged: tuple[str, ...] = ()

    def _path(self, path: str) -> Path:
        return self.root / path.lstrip("/")

    def addresses(self) -> list[str]:
        """The peer addresses of the nodes config the daemon's config names."""
        config_path = self._path(self.config)
        try:
            values = read_config(config_path.read_text(), self.config)
        except FileNotFoundError:
            raise ConfigError(
                f"{self.config}: no such file: the IMEX daemon has no config"
            ) from None
        nodes = values.get("IMEX_NODE_CONFIG_FILE") or HOST_NODES_CONFIG
        try:
            return read_nodes(self._path(nodes).read_text())
        except FileNotFoundError:
            raise ConfigError(
                f"{self.config}: IMEX_NODE_CONFIG_FILE={nodes}: no such file"
            ) from None

    def status(self) -> Domain:
        """Decide the domain now, and log what changed (each problem once, until it clears)."""
        try:
            addresses = self.addresses()
        except ConfigError as err:
            domain = Domain(False, "DOWN", None, (), (str(err),))
        else:
            hosts = {a: self.network.lookup(a) for a in dict.fromkeys([*addresses, self.address])}
            domain = decide(self.address, addresses, hosts)
        self._log(domain)
        return domain

    def _log(self, domain: Domain) -> None:
        for problem in domain.problems:
            if problem not in self._logged:
                log.error("IMEX daemon on %s: %s", self.node, problem)
        if self._logged and not domain.problems:
            log.info(
                "IMEX daemon on %s: domain %s with %d node(s)",
                self.node,
                domain.state,
                len(domain.nodes),
            )
        self._logged = domain.problems

    def ctl(self, args: Iterable[str]) -> tuple[int, str]:
        """`nvidia-imex-ctl [-c <config>] -q|-N [-H]`: (exit code, output)."""
        words = list(args)
        if "-c" in words:
            at = words.index("-c")
            if at + 1 >= len(words):
                return EXIT_USAGE, "nvidia-imex-ctl: -c needs a config path\n"
            self.config = words[at + 1]
            del words[at : at + 2]
        if words == ["-q"]:
            domain = self.status()
            if domain.ready:
                return EXIT_OK, READY
            return EXIT_NOT_READY, "NOT READY: " + "; ".join(domain.problems) + "\n"
        if words in (["-N"], ["-N", "-H"], ["-H", "-N"]):
            return EXIT_OK, format_domain(self.status(), hostnames="-H" in words)
        return EXIT_USAGE, (
            "usage: nvidia-imex-ctl [-c <nvidia-imex config path>] <-q|-N> [-H]\n"
            "  -q: query the local IMEX daemon once (prints READY when it is)\n"
            "  -N: the status of the entire IMEX domain\n"
        )


def check(daemon: ImexDaemon, clique_id: str) -> tuple[int, str]:
    """`compute-domain-daemon check`, the DaemonSet's probes: a node without a clique passes
    (no IMEX daemon runs there); otherwise the local daemon must answer `READY\\n` exactly."""
    if not clique_id:
        return EXIT_OK, "check succeeded (noop, clique ID is empty)\n"
    code, out = daemon.ctl(["-c", DAEMON_CONFIG, "-q"])
    if code == EXIT_OK and out == READY:
        return EXIT_OK, ""
    return EXIT_NOT_READY, f"IMEX daemon not ready: {out}"
