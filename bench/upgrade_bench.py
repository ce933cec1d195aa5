"""Rolling driver upgrade figures: 1,000 nodes at maxParallelUpgrades 1, 10 and 100.

Two measurements, figures only (nothing is asserted):

* **modelled**: the controller's planner against `upgrade.simulate`'s clock (evict 30 s, driver
  300 s, validator 60 s per node): rollout time against the ideal
  `ceil(N / maxParallelUpgrades) x per-node time`, and the planner's own CPU time. This is how
  long a real fleet would take with those per-node times.
* **kubesim**: the operator as in a cluster, its own process (`gpu-operator controller`, every
  reconciler, started as bench/operator_scale.py starts it), installs a ClusterPolicy on N kubesim
  GPU nodes, each then running one GPU pod; the admin's edit of `spec.driver.version` then rolls
  the new driver through them, each driver pod ready `--driver-seconds` after it starts. Wall
  time against the ideal, API requests per upgraded node (everything the operator sent: node
  patches, evictions, pod deletes, Events, its status writes and Lease renewals), the CPU of
  both processes, and stranded cordons (nodes left unschedulable, or still carrying our cordon
  in their ledger) at the end. The phase breakdown comes from kubesim's side (the store's
  committed node label and pod changes: no request, nothing the operator sees). kubesim (API
  server, controllers, kubelets) is this process: `--sample-kubesim FILE` samples where its CPU
  goes through the rollout. Much of it is the workload's simulation: each evicted GPU pod's
  replacement waits Pending for a free GPU (kubesim's scheduler retries it with backoff, moved
  back only by node or pod changes that can fit it, as kube-scheduler's queueing hints do; its
  ReplicaSet controller counts pods from an index, not a scan).

Run: .venv/bin/python bench/upgrade_bench.py [--nodes 1000] [--parallel 1 10 100]
         [--kubesim-parallel 10 100] [--driver-seconds 0.5] [--sample-kubesim FILE]
(kubesim at maxParallelUpgrades 1 means 1,000 sequential node upgrades: add it with
`--kubesim-parallel 1 10 100` when you have the time.)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import kubesim
from gpu_operator.api import crds, keys
from gpu_operator.cli import render as render_mod
from gpu_operator.cli import upgrade_plan
from gpu_operator.nodes import ledger
from gpu_operator.upgrade import simulate, states
from kubesim import PodContext
from kubesim.controllers.kubelet import KubeletConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))
import history  # bench/history.py, next to this script: runs append their figures there
import operator_scale  # bench/operator_scale.py: the operator as its own process
from sampler import Sampler  # bench/sampler.py

NAMESPACE = "gpu-operator"
TIMING = simulate.Timing(eviction=30.0, driver_start=300.0, validation=60.0)
DRIVER_CTR = "nvidia-driver-ctr"
DRIVER_IMAGE = "nvcr.io/nvidia/driver"
OLD_VERSION = "580.95.05"
NEW_VERSION = "580.105.08"


# ----- modelled ---------------------------------------------------------------------------------


def modelled(nodes: int, parallel: int) -> dict[str, Any]:
    # The same offline snapshot `gpu-operator upgrade plan -f ... --facts ...` builds.
    facts = render_mod.parse_facts({"pools": [{"name": "gpu", "nodes": nodes}]})
    work = upgrade_plan.UpgradeFacts.model_validate({"workloads": {"gpu": {"gpuPods": 1}}})
    snap = upgrade_plan.offline_snapshot(_policy(parallel), facts, work)
    started = time.process_time()
    outcome = simulate.run(snap, TIMING)
    cpu = time.process_time() - started
    per_node = TIMING.per_node(precompiled=False, evicts=True, validates=True)
    ideal = math.ceil(nodes / parallel) * per_node
    done = sum(1 for r in outcome.nodes.values() if r.state == states.UPGRADE_DONE)
    return {
        "parallel": parallel,
        "done": done,
        "modelled_s": outcome.duration,
        "ideal_s": ideal,
        "ratio": outcome.duration / ideal,
        "peak_in_progress": outcome.peak_in_progress,
        "planner_passes": outcome.steps,
        "planner_cpu_s": cpu,
        "cpu_ms_per_pass": 1000 * cpu / outcome.steps,
    }


# ----- where the time goes ---------------------------------------------------------------------

# The milestones of one node's upgrade, in order, and the phase each one ends.
PHASES = (
    ("start", "slot hand-over (a slot freed -> the next node started)"),
    ("cordoned", "cordon (started -> cordoned, state pod-deletion-required)"),
    ("evicted", "eviction asked (cordoned -> GPU pod evicted)"),
    ("gpu_gone", "GPU pod termination (kubelet)"),
    ("restart_state", "pass: GPU pods gone -> pod-restart-required"),
    ("driver_deleted", "pass: old driver pod deleted"),
    ("driver_created", "DaemonSet controller: old pod gone -> new pod created"),
    ("driver_running", "kubelet: new pod created -> containers running"),
    ("driver_ready", "driver build and load (--driver-seconds, the ideal)"),
    ("validation_state", "pass: driver ready -> validation-required"),
    ("validator_ready", "validator on the new driver ready (after validation-required)"),
    ("uncordon_state", "pass: validated -> uncordon-required"),
    ("done", "pass: uncordoned -> upgrade-done"),
)


def _reached(marks: dict[str, float], milestone: str) -> float:
    """When a milestone counts as reached: not before any milestone ahead of it."""
    names = [name for name, _ in PHASES]
    return max(marks[name] for name in names[: names.index(milestone) + 1])


class Timeline:
    """When each node reached each milestone of its upgrade, from the store's committed events
    (a synchronous listener: no API requests, nothing the operator sees)."""

    def __init__(self, store: Any) -> None:
        self.marks: dict[str, dict[str, float]] = {}
        self.origin = 0.0
        self.recording = False
        self.validator_restarts = 0
        self._unsubscribe = store.subscribe(self._event, [("", "nodes"), ("", "pods")])

    def begin(self) -> None:
        self.origin = time.monotonic()
        self.recording = True

    def close(self) -> None:
        self._unsubscribe()

    def done(self) -> int:
        """How many nodes reached upgrade-done since `begin`."""
        return sum(1 for marks in self.marks.values() if "done" in marks)

    def _mark(self, node: str, milestone: str) -> None:
        self.marks.setdefault(node, {}).setdefault(milestone, time.monotonic() - self.origin)

    def _event(self, event: Any) -> None:
        if not self.recording:
            return
        obj = event.new.obj
        old = event.old.obj if event.old is not None else None
        if event.key == ("", "nodes"):
            state = (obj["metadata"].get("labels") or {}).get(states.STATE_LABEL)
            before = ((old or {}).get("metadata", {}).get("labels") or {}).get(states.STATE_LABEL)
            if state == before:
                return
            milestone = {
                states.CORDON_REQUIRED: "start",
                states.POD_DELETION_REQUIRED: "cordoned",
                states.POD_RESTART_REQUIRED: "restart_state",
                states.VALIDATION_REQUIRED: "validation_state",
                states.UNCORDON_REQUIRED: "uncordon_state",
                states.UPGRADE_DONE: "done",
            }.get(state or "")
            if milestone is not None:
                node = obj["metadata"]["name"]
                if milestone == "restart_state":
                    self._mark(node, "start")  # a restart-only upgrade starts here
                self._mark(node, milestone)
            return
        node = (obj.get("spec") or {}).get("nodeName")
        if not node:
            return
        labels = obj["metadata"].get("labels") or {}
        app = labels.get("app")
        meta = obj["metadata"]
        deleting = event.type == "DELETED" or bool(meta.get("deletionTimestamp"))
        was_deleting = old is not None and bool(old["metadata"].get("deletionTimestamp"))
        if app == "train":
            if deleting and not was_deleting:
                self._mark(node, "evicted")
            if event.type == "DELETED":
                self._mark(node, "gpu_gone")
        elif app == states.DRIVER_APP:
            if event.type == "ADDED":
                self._mark(node, "driver_created")
            elif deleting and not was_deleting:
                self._mark(node, "driver_deleted")
            elif not deleting and "driver_created" in self.marks.get(node, {}):
                status = obj.get("status") or {}
                if status.get("phase") == "Running":
                    self._mark(node, "driver_running")
                ready = any(
                    c.get("type") == "Ready" and c.get("status") == "True"
                    for c in status.get("conditions") or ()
                )
                if ready:
                    self._mark(node, "driver_ready")
        elif app == states.VALIDATOR_APP:
            # Validator pods created after the old driver went check the new one.
            if "driver_deleted" not in self.marks.get(node, {}):
                return
            if event.type == "ADDED":
                self.validator_restarts += 1
            if deleting:
                return
            ready = any(
                c.get("type") == "Ready" and c.get("status") == "True"
                for c in (obj.get("status") or {}).get("conditions") or ()
            )
            if ready:
                self.marks[node]["validator_ready"] = time.monotonic() - self.origin

    def breakdown(self, batches: int) -> list[dict[str, Any]]:
        """Each phase's mean seconds per node and its share of the wall time (the nodes of a
        batch run their phases side by side, so a batch costs about the sum of the means)."""
        complete = [m for m in self.marks.values() if all(k in m for k, _ in PHASES[1:])]
        if not complete:
            return []
        dones = sorted(m["done"] for m in complete)
        handovers = []
        for marks in complete:
            freed = [d for d in dones if d <= marks["start"]]
            handovers.append(marks["start"] - (freed[-1] if freed else 0.0))
        rows = [
            {
                "phase": PHASES[0][0],
                "what": PHASES[0][1],
                "mean_s": sum(handovers) / len(handovers),
            }
        ]
        for (before, _), (name, what) in itertools.pairwise(PHASES):
            # A milestone reached before the one ahead of it (a validator ready before the
            # driver) costs nothing of its own: clamp to the one ahead.
            spans = [max(0.0, m[name] - _reached(m, before)) for m in complete]
            rows.append({"phase": name, "what": what, "mean_s": sum(spans) / len(spans)})
        for row in rows:
            row["per_rollout_s"] = row["mean_s"] * batches
        return rows


# ----- kubesim ----------------------------------------------------------------------------------


def _policy(parallel: int) -> dict[str, Any]:
    return {
        "apiVersion": "nvidia.com/v1",
        "kind": "ClusterPolicy",
        "metadata": {"name": "cluster-policy"},
        "spec": {
            "operator": {},
            "daemonsets": {},
            "toolkit": {},
            "devicePlugin": {},
            "dcgmExporter": {},
            "dcgm": {"enabled": False},
            "nodeStatusExporter": {},
            "gfd": {},
            "driver": {
                "repository": "nvcr.io/nvidia",
                "image": "driver",
                "version": OLD_VERSION,
                "upgradePolicy": {
                    "autoUpgrade": True,
                    "maxParallelUpgrades": parallel,
                    "maxUnavailable": "100%",
                },
            },
        },
    }


async def on_kubesim(
    nodes: int, parallel: int, driver_seconds: float, sample: Path | None = None
) -> dict[str, Any]:
    config = KubeletConfig(instant=True, lease_interval=None)
    # The operand images are made up (registry.local, see operator_scale.start_operator).
    async with kubesim.Cluster(
        kubelet=config, node_filesystems=False, images=operator_scale.FAKE_REGISTRY
    ) as sim:

        async def driver(ctx: PodContext) -> None:
            # The driver's build and load: ready a fixed time after it starts.
            await asyncio.sleep(driver_seconds)
            ctx.set_ready(True)
            await ctx.stopping.wait()

        sim.register_pod_runner(
            driver,
            label_selector=f"app={states.DRIVER_APP}",
            container=DRIVER_CTR,
            reports_readiness=True,
        )
        store = sim.store
        store.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        store.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml"}})
        for crd in crds.all_crds().values():
            store.create(crd)
        names = [f"gpu-{i:04d}" for i in range(nodes)]
        for name in names:
            sim.add_node(name, labels=dict(operator_scale.GPU_LABELS))
        # The operator as in a cluster: its own process, every reconciler, the chart's flags.
        operator = operator_scale.start_operator(sim)
        timeline = Timeline(store)
        sampler = Sampler() if sample is not None else None
        try:
            store.create(_policy(parallel))
            # The GPUs appear once the operator's device plugin is deployed (capacity before
            # that would be another device plugin's, and the operator would stay off the node).
            plugin = keys.DEPLOY_PREFIX + "device-plugin"

            def deployed() -> bool:
                return all(
                    (n["metadata"].get("labels") or {}).get(plugin) == "true"
                    for n in store.list("nodes")
                )

            await _wait_until(deployed, 600)
            gpu = {"nvidia.com/gpu": "1"}
            for name in names:
                store.patch(
                    "nodes", name, {"status": {"capacity": gpu, "allocatable": gpu}}, status=True
                )
            await sim.wait_for(lambda: operator_scale.state(sim) == "ready", 600, "ready")
            store.create(_workload(nodes))
            old = f"{DRIVER_IMAGE}:{OLD_VERSION}"
            await _wait_until(lambda: _all_done(store, nodes, old, with_workload=True), 600)
            await sim.settle()
            await operator_scale.operator_quiet(operator.pid)
            before = sim.stats.snapshot()
            cpu = operator_scale.cpu_seconds()
            operator_cpu = operator_scale.cpu_seconds(operator.pid)
            started = time.monotonic()
            timeline.begin()
            if sampler is not None:
                sampler.start()
            # The admin's edit: a new driver version in the ClusterPolicy.
            store.patch(
                "clusterpolicies.nvidia.com",
                "cluster-policy",
                {"spec": {"driver": {"version": NEW_VERSION}}},
            )
            new = f"{DRIVER_IMAGE}:{NEW_VERSION}"
            # Polled from the timeline (listing the fleet every 0.25 s cost a fifth of
            # kubesim's CPU), then checked on the store once.
            await _wait_until(
                lambda: timeline.done() >= nodes and _all_done(store, nodes, new), 7200
            )
            wall = time.monotonic() - started
            if sampler is not None and sample is not None:
                sampler.stop()
                sample.write_text(sampler.report(40, root=f"{operator_scale.ROOT}/") + "\n")
            kubesim_cpu = operator_scale.cpu_seconds() - cpu
            operator_cpu = operator_scale.cpu_seconds(operator.pid) - operator_cpu
            requests = sim.stats.since(before)
        finally:
            if sampler is not None:
                sampler.stop()  # idempotent; its timer signal would kill an unwinding run
            timeline.close()
            operator.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                operator.wait(10)
        stranded = [
            n["metadata"]["name"]
            for n in store.list("nodes")
            if (n.get("spec") or {}).get("unschedulable")
            or ledger.CORDON in ledger.read(n["metadata"].get("annotations") or {})
        ]
    total = sum(requests.values())
    by_kind: dict[str, int] = {}
    for (verb, resource), count in requests.items():
        key = f"{verb} {resource}"
        by_kind[key] = by_kind.get(key, 0) + count
    ideal = math.ceil(nodes / parallel) * driver_seconds
    return {
        "parallel": parallel,
        "wall_s": wall,
        "ideal_s": ideal,
        "ratio": wall / ideal,
        "overhead_per_batch_s": (wall - ideal) / math.ceil(nodes / parallel),
        "requests_per_node": total / nodes,
        "requests": dict(sorted(by_kind.items(), key=lambda kv: -kv[1])),
        "operator_cpu_s": operator_cpu,
        "kubesim_cpu_s": kubesim_cpu,
        "stranded_cordons": len(stranded),
        "breakdown": timeline.breakdown(math.ceil(nodes / parallel)),
        "validator_pods_per_node": timeline.validator_restarts / nodes,
    }


def _workload(nodes: int) -> dict[str, Any]:
    """One GPU pod per node (what the upgrade drains). An evicted pod's replacement waits
    Pending for a free GPU until its node is uncordoned (see the docstring)."""
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "train", "namespace": "ml"},
        "spec": {
            "replicas": nodes,
            "selector": {"matchLabels": {"app": "train"}},
            "template": {
                "metadata": {"labels": {"app": "train"}},
                "spec": {
                    "containers": [
                        {
                            "name": "main",
                            "image": "nvcr.io/nvidia/cuda:13.0.1-base-ubuntu24.04",
                            "resources": {"limits": {"nvidia.com/gpu": "1"}},
                        }
                    ]
                },
            },
        },
    }


def _all_done(store: Any, nodes: int, image: str, *, with_workload: bool = False) -> bool:
    """Every node upgrade-done and running a live driver pod of `image` (and, with
    `with_workload`, its GPU pod running)."""
    listed = store.list("nodes")
    if any(
        (n["metadata"].get("labels") or {}).get(states.STATE_LABEL) != states.UPGRADE_DONE
        for n in listed
    ):
        return False
    pods = store.list("pods", NAMESPACE, label_selector=f"app={states.DRIVER_APP}")
    live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
    if len(live) != nodes or not all(
        c["image"].startswith(image)
        for p in live
        for c in p["spec"]["containers"]
        if c["name"] == DRIVER_CTR
    ):
        return False
    if with_workload:
        train = store.list("pods", "ml", label_selector="app=train")
        running = [p for p in train if (p.get("status") or {}).get("phase") == "Running"]
        return len(running) == nodes
    return True


async def _wait_until(done: Any, timeout: float) -> None:
    # Polled: re-checking on every store change would cost more than what is measured.
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError("the rollout did not finish")
        await asyncio.sleep(0.25)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--parallel", type=int, nargs="*", default=[1, 10, 100])
    parser.add_argument("--kubesim-parallel", type=int, nargs="*", default=[10, 100])
    parser.add_argument("--driver-seconds", type=float, default=0.5)
    parser.add_argument("--json", action="store_true", help="print JSON instead of lines")
    parser.add_argument(
        "--sample-kubesim",
        type=Path,
        metavar="FILE",
        help="sample this process (kubesim: API server, controllers, kubelets) through the "
        "rollout and write its top functions to FILE (FILE.<parallel> with several)",
    )
    args = parser.parse_args()
    results: dict[str, list[dict[str, Any]]] = {"modelled": [], "kubesim": []}
    for parallel in args.parallel:
        row = modelled(args.nodes, parallel)
        results["modelled"].append(row)
        history.append(
            "upgrade_modelled",
            {"ratio": row["ratio"], "cpu_ms_per_pass": row["cpu_ms_per_pass"]},
            config={"nodes": args.nodes, "parallel": parallel},
        )
        if not args.json:
            print(
                f"modelled  N={args.nodes} maxParallelUpgrades={parallel:<3}: "
                f"{row['modelled_s'] / 3600:7.2f} h vs ideal {row['ideal_s'] / 3600:7.2f} h "
                f"(x{row['ratio']:.3f}); {row['done']} done; peak in progress "
                f"{row['peak_in_progress']}; {row['planner_passes']} planner passes at "
                f"{row['cpu_ms_per_pass']:.1f} ms CPU each",
                flush=True,
            )
    for parallel in args.kubesim_parallel:
        sample = args.sample_kubesim
        if sample is not None and len(args.kubesim_parallel) > 1:
            sample = sample.with_name(f"{sample.name}.{parallel}")
        row = asyncio.run(on_kubesim(args.nodes, parallel, args.driver_seconds, sample))
        results["kubesim"].append(row)
        figures = {
            "wall_s": row["wall_s"],
            "ratio": row["ratio"],
            "requests_per_node": row["requests_per_node"],
            "operator_cpu_s": row["operator_cpu_s"],
            "kubesim_cpu_s": row["kubesim_cpu_s"],
            "stranded_cordons": row["stranded_cordons"],
        }
        figures.update({f"phase_s {p['phase']}": p["mean_s"] for p in row["breakdown"]})
        config = {"nodes": args.nodes, "parallel": parallel, "driver_seconds": args.driver_seconds}
        history.append("upgrade_kubesim", figures, config=config)
        if not args.json:
            top = ", ".join(f"{k} {v}" for k, v in list(row["requests"].items())[:6])
            print(
                f"kubesim   N={args.nodes} maxParallelUpgrades={parallel:<3}: "
                f"{row['wall_s']:7.1f} s vs ideal {row['ideal_s']:7.1f} s (x{row['ratio']:.2f}, "
                f"{row['overhead_per_batch_s']:.2f} s overhead per batch); "
                f"{row['requests_per_node']:.1f} API requests per upgraded node ({top}); "
                f"CPU: operator {row['operator_cpu_s']:.1f} s, kubesim "
                f"{row['kubesim_cpu_s']:.1f} s; stranded cordons: {row['stranded_cordons']}",
                flush=True,
            )
            print(
                f"  where the {row['wall_s']:.1f} s go (mean seconds per node; x "
                f"{math.ceil(args.nodes / parallel)} batches; validator pods per node "
                f"{row['validator_pods_per_node']:.2f}):",
                flush=True,
            )
            for phase in row["breakdown"]:
                print(
                    f"    {phase['mean_s']:6.3f} s  {phase['per_rollout_s']:7.1f} s  "
                    f"{phase['what']}",
                    flush=True,
                )
    if args.json:
        print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
