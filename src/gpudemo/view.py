"""What the demo shows: a snapshot of nodes x operands read from the simulated store, the live
table, the plain progress line for non-terminals, and the closing summary."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from gpu_operator.agents.dra_kubelet_plugin.slices import DRIVER as DRA_DRIVER
from gpu_operator.agents.gfd import labels as gfd_labels
from gpu_operator.api import keys
from gpu_operator.nvml import machines
from gpudemo import programs
from kubesim.errors import ApiError
from kubesim.store import Store

# Short column titles per DaemonSet (app label); unknown ones are shortened generically.
SHORT_NAMES: dict[str, str] = {
    "nvidia-driver-daemonset": "driver",
    "nvidia-container-toolkit-daemonset": "toolkit",
    "nvidia-operator-validator": "validator",
    "nvidia-device-plugin-daemonset": "device-plugin",
    "nvidia-device-plugin-mps-control-daemon": "mps",
    "nvidia-dcgm": "dcgm",
    "nvidia-dcgm-exporter": "dcgm-exporter",
    "gpu-feature-discovery": "gfd",
    "nvidia-mig-manager": "mig-manager",
    "nvidia-node-status-exporter": "node-status",
}


# The NFD sub-chart's worker DaemonSet is `<release>-node-feature-discovery-worker`.
NFD_WORKER_SUFFIX = "node-feature-discovery-worker"
# The GPUCluster (one per cluster, by this name) that runs the DRA stack instead of a policy.
GPU_CLUSTER = "gpu-cluster"


def short_name(app: str) -> str:
    if app.startswith(programs.DRIVER_APP_PREFIX):
        return "driver"
    if app.endswith(NFD_WORKER_SUFFIX):
        return "nfd"
    return SHORT_NAMES.get(app) or app.removeprefix("nvidia-").removesuffix("-daemonset")


@dataclass(frozen=True)
class Cell:
    """One node x operand: `ready`, `starting`, `init n/m`, `pending` or `-` (not here)."""

    text: str
    style: str


NOT_HERE = Cell("·", "dim")


@dataclass
class NodeRow:
    name: str
    gpu_node: bool
    product: str
    gpu_count: int
    allocatable: str
    cells: dict[str, Cell] = field(default_factory=dict)
    # What this node's workload config deploys: GFD labels it, and the container device plugin
    # advertises its GPUs, only on container nodes (VM nodes have the sandbox operands).
    needs_gfd: bool = True
    needs_allocatable: bool = True
    workload: str = keys.WORKLOAD_CONTAINER
    # What the node's workload config label asks for ("" when unlabelled): a VM workload
    # there while sandbox workloads are off still gets the container stack.
    requested_workload: str = ""

    @property
    def ready(self) -> bool:
        return all(c.text in ("ready", "·") for c in self.cells.values())


@dataclass
class Snapshot:
    """Everything the view needs, read in one pass over the store."""

    elapsed: float
    columns: list[str]
    rows: list[NodeRow]
    policy_state: str
    policy_message: str
    pods_ready: int
    pods_total: int
    daemonsets_done: bool
    # What runs the stack: the ClusterPolicy, or a GPUCluster (the DRA stack).
    policy_kind: str = "ClusterPolicy"

    @property
    def gpu_rows(self) -> list[NodeRow]:
        return [r for r in self.rows if r.gpu_node]

    @property
    def labelled(self) -> int:
        return sum(1 for r in self.gpu_rows if r.product and r.needs_gfd)

    @property
    def gfd_rows(self) -> list[NodeRow]:
        return [r for r in self.gpu_rows if r.needs_gfd]

    @property
    def converged(self) -> bool:
        """Policy ready, every DaemonSet rolled out, every GPU node labelled and advertised."""
        return (
            self.policy_state == "ready"
            and self.daemonsets_done
            and self.pods_ready == self.pods_total
            and all(
                (r.product or not r.needs_gfd) and (r.allocatable != "-" or not r.needs_allocatable)
                for r in self.gpu_rows
            )
        )


def _selected(ds: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    selector = ((ds.get("spec") or {}).get("template") or {}).get("spec", {}).get(
        "nodeSelector"
    ) or {}
    return all(labels.get(k) == v for k, v in selector.items())


def _pod_cell(pod: Mapping[str, Any]) -> Cell:
    status = pod.get("status") or {}
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return Cell("stopping", "magenta")
    conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
    if conditions.get("Ready") == "True":
        return Cell("ready", "bold green")
    inits = status.get("initContainerStatuses") or []
    done = sum(1 for s in inits if ((s.get("state") or {}).get("terminated") or {}).get(
        "exitCode") == 0)  # fmt: skip
    if inits and done < len(inits):
        return Cell(f"init {done}/{len(inits)}", "yellow")
    if status.get("phase") == "Running":
        return Cell("starting", "cyan")
    return Cell("pending", "yellow")


def snapshot(
    store: Store, namespace: str, policy_name: str, elapsed: float, gpu_nodes: set[str]
) -> Snapshot:
    """Read nodes, operand DaemonSets and pods, and the ClusterPolicy status."""
    daemonsets = sorted(
        (d for d in store.list("daemonsets", namespace=namespace)),
        key=lambda d: _column_order(d["metadata"]["name"]),
    )
    columns: list[str] = []
    for ds in daemonsets:
        name = short_name(ds["metadata"]["name"])
        if name not in columns:
            columns.append(name)
    # Pods by node and owning DaemonSet (NFD's pods have no `app` label; the owner is exact).
    pods: dict[tuple[str, str], dict[str, Any]] = {}
    for pod in store.list("pods", namespace=namespace):
        node = (pod.get("spec") or {}).get("nodeName", "")
        for ref in pod["metadata"].get("ownerReferences") or []:
            if ref.get("kind") == "DaemonSet":
                pods[(node, str(ref.get("uid")))] = pod
    rows = []
    ready = total = 0
    for node in sorted(store.list("nodes"), key=lambda n: n["metadata"]["name"]):
        name = node["metadata"]["name"]
        labels = node["metadata"].get("labels") or {}
        capacity = (node.get("status") or {}).get("allocatable") or {}
        nvidia = {k: v for k, v in capacity.items() if k.startswith("nvidia.com/")}
        allocatable = ", ".join(
            f"{v} {k.removeprefix('nvidia.com/')}" for k, v in sorted(nvidia.items())
        )
        row = NodeRow(
            name=name,
            gpu_node=name in gpu_nodes or labels.get(keys.GPU_PRESENT) == "true",
            product=labels.get(keys.GPU_PRODUCT, ""),
            gpu_count=int(labels.get("nvidia.com/gpu.count", "0") or 0),
            allocatable=allocatable or "-",
            needs_gfd=_deploys(labels, "gpu-feature-discovery"),
            needs_allocatable=_deploys(labels, "device-plugin"),
            workload=_workload(labels),
            requested_workload=labels.get(keys.GPU_WORKLOAD_CONFIG, ""),
        )
        for ds in daemonsets:
            column = short_name(ds["metadata"]["name"])
            found = pods.get((name, str(ds["metadata"].get("uid"))))
            if found is not None:
                cell = _pod_cell(found)
                total += 1
                ready += cell.text == "ready"
            elif _selected(ds, labels):
                cell = Cell("pending", "yellow")
                total += 1
            elif column in row.cells:
                continue  # several driver DaemonSets share a column; keep the matching one
            else:
                cell = NOT_HERE
            row.cells[column] = cell
        rows.append(row)
    try:
        policy = store.get("clusterpolicies.nvidia.com", policy_name) or {}
    except ApiError:  # the CRD is not installed yet (helm installs it)
        policy = {}
    kind = "ClusterPolicy"
    if not policy:  # the DRA stack: the GPUCluster's status, in the same shape
        try:
            policy = store.get("gpuclusters.nvidia.com", GPU_CLUSTER) or {}
        except ApiError:
            policy = {}
        kind = "GPUCluster" if policy else kind
    status = policy.get("status") or {}
    message = ""
    for condition in status.get("conditions") or []:
        # Ready's message says why in every case (Error's only points to it during planned work).
        if condition.get("type") == "Ready":
            message = str(condition.get("message") or "")
    done = all(
        (d.get("status") or {}).get("observedGeneration", 0)
        >= (d["metadata"].get("generation") or 0)
        and (d.get("status") or {}).get("numberReady", 0)
        == (d.get("status") or {}).get("desiredNumberScheduled", -1)
        for d in daemonsets
    )
    return Snapshot(
        elapsed=elapsed,
        columns=columns,
        rows=rows,
        policy_state=str(status.get("state") or "pending"),
        policy_message=message,
        pods_ready=ready,
        pods_total=total,
        daemonsets_done=done,
        policy_kind=kind,
    )


def _column_order(ds_name: str) -> tuple[int, str]:
    order = list(SHORT_NAMES)
    name = programs.DRIVER_APP_PREFIX if ds_name.startswith(programs.DRIVER_APP_PREFIX) else ds_name
    return (order.index(name) if name in order else len(order), ds_name)


def _is_simulated(column: str) -> bool:
    real = {short_name(app) for app in programs.REAL_AGENTS} | {"nfd"}
    return column not in real


def _deploys(labels: Mapping[str, str], operand: str) -> bool:
    """Whether the operator deploys an operand to the node (before it labelled the node at
    all, the container stack is assumed)."""
    if not any(k.startswith(keys.DEPLOY_PREFIX) for k in labels):
        return True
    return labels.get(keys.DEPLOY_PREFIX + operand) == "true"


def _workload(labels: Mapping[str, str]) -> str:
    """The node's workload config as its deploy labels show it: what the operator deploys there,
    whatever the workload config label asks for (with sandbox workloads off, a node labelled
    `vm-passthrough` still gets the container stack). Before the operator labelled the node,
    the label's wish."""
    for operand, workload in (
        ("vfio-manager", keys.WORKLOAD_VM_PASSTHROUGH),
        ("vgpu-device-manager", keys.WORKLOAD_VM_VGPU),
        ("vgpu-manager", keys.WORKLOAD_VM_VGPU),
    ):
        if keys.DEPLOY_PREFIX + operand in labels:
            return workload
    if any(k.startswith(keys.DEPLOY_PREFIX) and k != keys.DEPLOY_OPERANDS for k in labels):
        return keys.WORKLOAD_CONTAINER
    return labels.get(keys.GPU_WORKLOAD_CONFIG) or keys.WORKLOAD_CONTAINER


VM_WORKLOADS = (keys.WORKLOAD_VM_PASSTHROUGH, keys.WORKLOAD_VM_VGPU)


def machine_gpus(spec: machines.MachineSpec) -> dict[str, int]:
    """A machine's GPUs by model, named as GFD's `nvidia.com/gpu.product` names them."""
    return dict(Counter(gfd_labels.sanitise(m.nvml_name) for m in spec.gpu_models()))


def _gpus(row: NodeRow) -> str:
    if not row.gpu_node:
        return "-"
    if not row.product and row.workload != keys.WORKLOAD_CONTAINER:
        return f"({row.workload})"  # no GFD on VM nodes
    if not row.product:
        return "?"
    return f"{row.gpu_count} x {row.product.removeprefix('NVIDIA-')}"


def table(snap: Snapshot, title: str) -> RenderableType:
    """The live table: one row per node, one column per operand DaemonSet."""
    grid = Table(title=title, title_justify="left", expand=False, pad_edge=False)
    grid.add_column("node", no_wrap=True)
    grid.add_column("GPUs (GFD labels)", no_wrap=True)
    grid.add_column("allocatable", no_wrap=True)
    for column in snap.columns:
        grid.add_column(column + ("*" if _is_simulated(column) else ""), no_wrap=True)
    for row in snap.rows:
        cells = [Text(row.cells.get(c, NOT_HERE).text, row.cells.get(c, NOT_HERE).style)
                 for c in snap.columns]  # fmt: skip
        grid.add_row(
            Text(row.name, "bold" if row.ready and row.gpu_node else ""),
            _gpus(row),
            row.allocatable,
            *cells,
        )
    state_style = "bold green" if snap.policy_state == "ready" else "yellow"
    footer = Text.assemble(
        (f"{snap.policy_kind}: ", "bold"),
        (snap.policy_state, state_style),
        f"   operand pods ready {snap.pods_ready}/{snap.pods_total}",
        f"   {_gfd_progress(snap)}",
        f"   {snap.elapsed:5.1f}s",
    )
    parts: list[RenderableType] = [grid, footer]
    if snap.policy_state != "ready" and snap.policy_message:
        parts.append(Text(_clip(snap.policy_message, 160), "dim"))
    if any(_is_simulated(c) for c in snap.columns):
        parts.append(Text(SIMULATED_NOTE, "dim italic"))
    return Group(*parts)


def _gfd_progress(snap: Snapshot) -> str:
    """How many GPU nodes carry GPU feature discovery's labels (the operator's and NFD's labels
    come long before: driver pods run on nodes GFD has not labelled yet)."""
    return f"GFD labels on {snap.labelled}/{len(snap.gfd_rows)} GPU nodes"


SIMULATED_NOTE = (
    "* simulated operand (NVIDIA's image only, no agent of ours): its pods become ready after a"
    " realistic delay; the other columns run the real agents on each node's mock GPUs"
)


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def progress_line(snap: Snapshot) -> str:
    """One plain line for logs and pipes."""
    waiting = ""
    if snap.policy_state != "ready" and snap.policy_message:
        waiting = " | " + _clip(snap.policy_message, 140)
    return (
        f"[{snap.elapsed:5.1f}s] {snap.policy_kind} {snap.policy_state}; operand pods ready "
        f"{snap.pods_ready}/{snap.pods_total}; {_gfd_progress(snap)}{waiting}"
    )


@dataclass(frozen=True)
class Summary:
    """The closing numbers."""

    nodes: int
    gpu_nodes: int
    gpus_by_model: dict[str, int]
    allocatable: dict[str, int]
    labels_set: int
    gfd_labels: int
    time_to_ready: float
    simulated: list[str]
    real: list[str]
    # GPU nodes per VM workload config the operator deploys (the VM stack runs there).
    vm_nodes: dict[str, int] = field(default_factory=dict)
    # GPUs in gpus_by_model counted from the fleet's machines, on GPU nodes without GFD labels
    # (VM nodes: GFD does not run there).
    unlabelled_gpus: int = 0
    # GPU nodes whose workload config label asks for a VM workload while the operator deploys
    # the container stack (sandbox workloads are off): their GPUs go to containers.
    vm_asked_containers: list[str] = field(default_factory=list)
    # What the ClusterPolicy's Ready message adds to "all operand states ready": coexistence
    # findings, nodes waiting at the startup gate, labels left alone.
    policy_notes: str = ""
    # Devices the GPU DRA driver (gpu.nvidia.com) publishes in ResourceSlices, by their `type`
    # attribute (gpu, mig), and the nodes publishing them.
    dra_devices: dict[str, int] = field(default_factory=dict)
    dra_nodes: int = 0


def _plural(count: int) -> str:
    return "" if count == 1 else "s"


def _dra_devices(store: Store) -> tuple[dict[str, int], int]:
    devices: Counter[str] = Counter()
    nodes: set[str] = set()
    for item in store.list("resourceslices"):
        spec = item.get("spec") or {}
        if spec.get("driver") != DRA_DRIVER:
            continue
        for device in spec.get("devices") or []:
            kind = ((device.get("attributes") or {}).get("type") or {}).get("string") or "other"
            devices[str(kind)] += 1
            if spec.get("nodeName"):
                nodes.add(str(spec["nodeName"]))
    return dict(sorted(devices.items())), len(nodes)


def summarize(
    store: Store,
    snap: Snapshot,
    gfd_annotation: str,
    hardware: Mapping[str, Mapping[str, int]] | None = None,
) -> Summary:
    """Count nodes, GPUs by model, labels the operator and GFD set, and resources advertised.
    `hardware` (GPUs by model per node, from the fleet's machines) counts the GPUs of GPU nodes
    GFD does not label, such as VM nodes."""
    gpus: Counter[str] = Counter()
    allocatable: Counter[str] = Counter()
    labels_set = gfd_count = unlabelled = 0
    gpu_rows = {r.name for r in snap.gpu_rows}
    dra_devices, dra_nodes = _dra_devices(store)
    nodes = store.list("nodes")
    for node in nodes:
        name = node["metadata"]["name"]
        labels = node["metadata"].get("labels") or {}
        annotations = node["metadata"].get("annotations") or {}
        if labels.get(keys.GPU_PRODUCT):
            gpus[labels[keys.GPU_PRODUCT]] += int(labels.get("nvidia.com/gpu.count", "0") or 0)
        elif name in gpu_rows and hardware and name in hardware:
            gpus.update(hardware[name])
            unlabelled += sum(hardware[name].values())
        labels_set += sum(1 for k in labels if k.startswith(keys.PREFIX))
        gfd_count += len([k for k in annotations.get(gfd_annotation, "").split(",") if k])
        for key, value in ((node.get("status") or {}).get("allocatable") or {}).items():
            if key.startswith(keys.PREFIX):
                allocatable[key] += int(value)
    return Summary(
        nodes=len(nodes),
        gpu_nodes=len(snap.gpu_rows),
        gpus_by_model=dict(sorted(gpus.items())),
        allocatable=dict(sorted(allocatable.items())),
        labels_set=labels_set,
        gfd_labels=gfd_count,
        time_to_ready=snap.elapsed,
        simulated=[c for c in snap.columns if _is_simulated(c)],
        real=[c for c in snap.columns if not _is_simulated(c)],
        vm_nodes=dict(
            sorted(
                Counter(
                    r.workload for r in snap.gpu_rows if r.workload != keys.WORKLOAD_CONTAINER
                ).items()
            )
        ),
        unlabelled_gpus=unlabelled,
        vm_asked_containers=sorted(
            r.name
            for r in snap.gpu_rows
            if r.requested_workload in VM_WORKLOADS and r.workload == keys.WORKLOAD_CONTAINER
        ),
        policy_notes=_policy_notes(store),
        dra_devices=dra_devices,
        dra_nodes=dra_nodes,
    )


def _policy_notes(store: Store) -> str:
    """The sentences the active ClusterPolicy's Ready message has after its first one."""
    for policy in store.list("clusterpolicies.nvidia.com"):
        status = policy.get("status") or {}
        if status.get("state") == "ignored":
            continue
        for condition in status.get("conditions") or []:
            if condition.get("type") == "Ready":
                return str(condition.get("message") or "").partition("; ")[2]
    return ""


def summary_lines(summary: Summary, since: str = "ClusterPolicy creation") -> Sequence[str]:
    """The summary as plain lines (printed the same on terminals and pipes)."""
    models = ", ".join(f"{n} x {m}" for m, n in summary.gpus_by_model.items()) or "none"
    resources = ", ".join(f"{k}={v}" for k, v in summary.allocatable.items()) or "none"
    counted = f"{sum(summary.gpus_by_model.values())} in all"
    if summary.unlabelled_gpus:
        counted += (
            f"; {summary.unlabelled_gpus} on GPU nodes without GFD labels, counted from their"
            " machines"
        )
    asked = summary.vm_asked_containers
    return [
        "Summary",
        f"  nodes:            {summary.nodes} ({summary.gpu_nodes} with GPUs,"
        f" {summary.nodes - summary.gpu_nodes} CPU only)",
        f"  GPUs by model:    {models} ({counted})",
        *(
            [f"  VM nodes:         {', '.join(f'{n} {w}' for w, n in summary.vm_nodes.items())}"]
            if summary.vm_nodes
            else []
        ),
        f"  allocatable:      {resources}",
        *(
            [
                f"  DRA devices:      "
                f"{', '.join(f'{n} {t}' for t, n in summary.dra_devices.items())} in"
                f" ResourceSlices of {summary.dra_nodes} node{_plural(summary.dra_nodes)}"
                f" ({DRA_DRIVER})"
            ]
            if summary.dra_devices
            else []
        ),
        f"  labels set:       {summary.labels_set} nvidia.com/ node labels"
        f" ({summary.gfd_labels} of them by GPU feature discovery)",
        f"  time to ready:    {summary.time_to_ready:.1f}s from {since}",
        f"  real agents:      {', '.join(summary.real) or 'none'}",
        f"  simulated:        {', '.join(summary.simulated) or 'none'}",
        *([f"  policy notes:     {summary.policy_notes}"] if summary.policy_notes else []),
        *(
            [
                f"warning: {', '.join(asked)} ask{'s' if len(asked) == 1 else ''} for a VM "
                f"workload ({keys.GPU_WORKLOAD_CONFIG}) but sandbox workloads are off "
                "(sandboxWorkloads.enabled=false): the GPUs there go to containers"
            ]
            if asked
            else []
        ),
    ]
