"""Operator scale figures on kubesim: convergence time, API requests, steady state, RSS, latency.

The operator runs as a separate process (`gpu-operator controller`), exactly as in a cluster, so
its peak RSS is its own; kubesim runs in this process with an instant kubelet so that kubelet
delays do not hide the operator's cost, and without node filesystems (no operand reads files
here, and setting up every pod's hostPath volumes on this one machine is the simulator's cost,
not the control plane's). Events are recorded as on a real cluster unless `--no-events`.

New-node latency is measured twice: while the operand DaemonSets are still rolling out to the
fleet (joins start once the first pods exist, and the convergence figure includes those nodes),
and on a settled cluster. Run:

    .venv/bin/python bench/operator_scale.py --nodes 1000 5000 --steady 60
    .venv/bin/python bench/operator_scale.py --nodes 20000 --steady 5

The operator's CPU is reported to ready and to quiet (its passes after ready are over: under 2%
of a core for a second). `--profile FILE` runs the operator under cProfile (docs/reliability.md,
"Operator CPU at scale", reads one).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import os
import resource
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import kubesim
from gpu_operator.api import crds, keys
from gpu_operator.api.images import IMAGE_ENV
from kubesim.controllers.kubelet import KubeletConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))
import history  # bench/history.py, next to this script
from sampler import Sampler  # bench/sampler.py

NAMESPACE = "gpu-operator"
ROOT = Path(__file__).resolve().parent.parent
GPU_LABELS = {
    "feature.node.kubernetes.io/pci-10de.present": "true",
    keys.NFD_OS_ID: "ubuntu",
    keys.NFD_OS_VERSION_ID: "22.04",
    keys.NFD_KERNEL_FULL: "6.8.0-52-generic",
    keys.GPU_PRODUCT: "NVIDIA-H100-80GB-HBM3",
    keys.MIG_CAPABLE: "true",
}
POLICY: dict[str, Any] = {
    "apiVersion": "nvidia.com/v1",
    "kind": "ClusterPolicy",
    "metadata": {"name": "cluster-policy"},
    "spec": {
        "operator": {},
        "daemonsets": {},
        "driver": {"repository": "nvcr.io/nvidia", "image": "driver", "version": "580.95.05"},
        "toolkit": {},
        "devicePlugin": {},
        "dcgmExporter": {},
        "dcgm": {"enabled": False},
        "nodeStatusExporter": {},
        "gfd": {},
    },
}


def peak_rss_mb(pid: int) -> float:
    """VmHWM (the peak resident set) of a process, in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def reset_peak_rss() -> None:
    """Start this process's VmHWM again from its current RSS (so each size reports its own)."""
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def cpu_seconds(pid: int | None = None) -> float:
    """CPU time (user + system) a process has used; by default this one (the API server and
    its controllers)."""
    if pid is None:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def labelled(sim: kubesim.Cluster, name: str) -> bool:
    node = sim.store.peek(("", "nodes"), "", name)
    labels = (node.obj["metadata"].get("labels") or {}) if node is not None else {}
    return bool(labels.get(keys.GPU_PRESENT) == "true")


FAKE_REGISTRY = ("registry.local/*",)


def start_operator(
    sim: kubesim.Cluster, profile: Path | None = None, **env: str
) -> subprocess.Popen[bytes]:
    """The operator as its own process (as in a cluster), with fake operand images and `env`;
    with `profile`, under cProfile writing its statistics there when it is terminated."""
    images = {name: f"registry.local/{name.lower()}:v1" for name in set(IMAGE_ENV.values())}
    wrapper = ["-m", "cProfile", "-o", str(profile)] if profile is not None else []
    return subprocess.Popen(
        [
            sys.executable, *wrapper, "-m", "gpu_operator", "controller",
            "--kubeconfig", str(sim.kubeconfig_path), "--namespace", NAMESPACE,
            "--metrics-bind-address", "127.0.0.1:0",
            "--health-probe-bind-address", "127.0.0.1:0", "--log-level", "warning",
            "--leader-elect",  # as the chart runs it: the Lease renewals are steady-state traffic
        ],
        env={**os.environ, **images, **env},
    )  # fmt: skip


async def freeze_survivors(period: float = 1.0) -> None:
    """Move what survived into the collector's permanent generation every `period` seconds.

    kubesim keeps millions of small containers (objects, Events) that form no cycles; left in
    the collector's generations, every older-generation pass walks all of them (over a second
    at 5,000 nodes, stalling the API server). Frozen, they are still freed by reference
    counting; only cycles among them would outlive the run.
    """
    while True:
        await asyncio.sleep(period)
        gc.freeze()


async def loop_stalls(samples: list[float], period: float = 0.01) -> None:
    """Record how late each short sleep wakes up: how long a request could wait for the event
    loop that kubesim's API server shares with its controllers."""
    loop = asyncio.get_running_loop()
    while True:
        before = loop.time()
        await asyncio.sleep(period)
        samples.append(loop.time() - before - period)


async def progress(sim: kubesim.Cluster, pid: int, log: Any, period: float = 15.0) -> None:
    """Log where a long convergence stands every `period` seconds: pods, CPU used by both
    processes, the operator's RSS (a 20,000-node run takes minutes on a busy machine)."""
    started = time.monotonic()
    while True:
        await asyncio.sleep(period)
        log(
            f"  ... {time.monotonic() - started:.0f}s: {sim.store.count('pods')} pods, "
            f"CPU kubesim {cpu_seconds():.0f}s / operator {cpu_seconds(pid):.0f}s, "
            f"operator RSS peak {peak_rss_mb(pid):.0f} MB, state {state(sim)}"
        )


async def join(sim: kubesim.Cluster, name: str) -> float:
    """Seconds from a GPU node registering to the operator labelling it (a deadline for a
    broken run, not a goal: at 20,000 nodes on a busy machine a join during the rollout waits
    behind its events)."""
    started = time.monotonic()
    sim.add_node(name, labels=dict(GPU_LABELS))
    await sim.wait_for(lambda: labelled(sim, name), 600, f"{name} labelled")
    return time.monotonic() - started


def state(sim: kubesim.Cluster) -> str:
    # Read in place (a `get` copies): the readiness wait asks after every batch of store
    # changes, and this process's CPU is what the bench reports as kubesim's.
    rt = sim.store.registry.resolve("clusterpolicies.nvidia.com")
    found = sim.store.peek(rt.key, "", "cluster-policy")
    policy = found.obj if found is not None else {}
    return str((policy.get("status") or {}).get("state"))


def grouped(counts: dict[tuple[str, str], int]) -> str:
    by_key = Counter({f"{verb} {resource}": n for (verb, resource), n in counts.items()})
    return ", ".join(f"{key}={n}" for key, n in sorted(by_key.items())) or "none"


async def operator_quiet(pid: int, window: float = 1.0, limit: float = 600.0) -> None:
    """Return once the operator used under 2% of a core over `window` seconds (its passes after
    ready are over), or after `limit` seconds."""
    deadline = time.monotonic() + limit
    before = cpu_seconds(pid)
    while time.monotonic() < deadline:
        await asyncio.sleep(window)
        now = cpu_seconds(pid)
        if now - before < 0.02 * window:
            return
        before = now


async def run_size(
    nodes: int,
    steady: float,
    joins: int,
    events: bool,
    log: Any,
    *,
    tune_gc: bool = True,
    profile: Path | None = None,
    sample: Path | None = None,
) -> dict[str, Any]:
    result: dict[str, Any] = {"nodes": nodes, "events": events}
    reset_peak_rss()
    config = KubeletConfig(instant=True, lease_interval=None)
    # The operand images are made up (registry.local, see start_operator): its registry has them.
    async with kubesim.Cluster(
        kubelet=config, events=events, node_filesystems=False, images=FAKE_REGISTRY
    ) as sim:
        sim.store.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        for crd in crds.all_crds().values():
            sim.store.create(crd)
        for i in range(nodes):
            sim.add_node(f"gpu-{i:05d}", labels=dict(GPU_LABELS))
        freezer = None
        if tune_gc:
            gc.collect()
            gc.freeze()  # the nodes live as long as the run: no collector passes over them
            freezer = asyncio.get_running_loop().create_task(freeze_survivors())
        operator = start_operator(sim, profile)
        sampler = Sampler() if sample is not None else None
        try:
            # Let the operator list, open its watches and finish its start-up work (it labels
            # the fleet's nodes before any ClusterPolicy exists: at 20,000 nodes that took a
            # minute, and the ClusterPolicy's first pass queued behind it) before the clock
            # starts; that start-up is a figure of its own.
            launched = time.monotonic()
            await sim.wait_for(lambda: sim.stats.count("watch", "nodes") > 0, 600, "operator up")
            await asyncio.sleep(1.0)
            startup = sim.stats.snapshot()
            await operator_quiet(operator.pid)
            result["startup_s"] = time.monotonic() - launched
            result["startup_cpu_s"] = cpu_seconds(operator.pid)
            result["startup_requests"] = sim.stats.since(startup)
            log(
                f"  operator started and quiet in {result['startup_s']:.1f}s "
                f"({result['startup_cpu_s']:.1f}s operator CPU, RSS peak "
                f"{peak_rss_mb(operator.pid):.0f} MB): {grouped(result['startup_requests'])}"
            )
            before = sim.stats.snapshot()
            stalls: list[float] = []
            monitor = asyncio.get_running_loop().create_task(loop_stalls(stalls))
            cpu_before = cpu_seconds()
            operator_cpu_before = cpu_seconds(operator.pid)
            started = time.monotonic()
            if sampler is not None:
                sampler.start()
            sim.store.create(POLICY)
            reporter = asyncio.get_running_loop().create_task(progress(sim, operator.pid, log))

            # Joins while the operand DaemonSets roll out: from the first few hundred pods on.
            first_pods = min(300, nodes // 4)
            await sim.wait_for(lambda: sim.store.count("pods") >= first_pods, 1800, "rollout")
            during: list[float] = []
            rolling = 0
            for index in range(joins):
                during.append(await join(sim, f"gpu-rollout-{index:02d}"))
                rolling += state(sim) != "ready"
            result["join_rollout_s"] = during
            result["joins_while_rolling"] = rolling

            await sim.wait_for(lambda: state(sim) == "ready", 3600, "ClusterPolicy ready")
            result["converge_s"] = time.monotonic() - started
            reporter.cancel()
            if sampler is not None and sample is not None:
                sampler.stop()
                sample.write_text(sampler.report(40, root=f"{ROOT}/") + "\n")
            monitor.cancel()
            stalls.sort()
            result["stall_ms"] = (
                stalls[len(stalls) // 2] * 1000,
                stalls[int(len(stalls) * 0.99)] * 1000,
                stalls[-1] * 1000,
            )
            result["converge_cpu_s"] = cpu_seconds() - cpu_before
            result["operator_cpu_s"] = cpu_seconds(operator.pid) - operator_cpu_before
            result["pods"] = sim.store.count("pods")
            converge = sim.stats.since(before)
            result["converge_requests"] = converge
            log(
                f"  converged in {result['converge_s']:.1f}s "
                f"({result['converge_cpu_s']:.1f}s kubesim CPU, "
                f"{result['operator_cpu_s']:.1f}s operator CPU, {result['pods']} pods): "
                f"{grouped(converge)}"
            )
            # The passes that follow ready (status coalescing, the last pods' events) count too.
            await operator_quiet(operator.pid)
            result["quiet_s"] = time.monotonic() - started
            result["operator_quiet_cpu_s"] = cpu_seconds(operator.pid) - operator_cpu_before
            log(
                f"  operator quiet after {result['quiet_s']:.1f}s "
                f"({result['operator_quiet_cpu_s']:.1f}s operator CPU)"
            )
            log(f"  joins during rollout (s): {' '.join(f'{t:.3f}' for t in during)}")

            before = sim.stats.snapshot()
            await asyncio.sleep(steady)
            result["steady_requests"] = sim.stats.since(before)
            log(f"  steady {steady:.0f}s: {grouped(result['steady_requests'])}")

            # Settled joins: nothing else runs in kubesim's loop, so only the operator's
            # reaction and the requests it makes are measured.
            await sim.settle(600)
            settled: list[float] = []
            for index in range(joins):
                settled.append(await join(sim, f"gpu-new-{index:02d}"))
                await sim.settle(600)
            result["join_settled_s"] = settled
            log(f"  joins on a settled cluster (s): {' '.join(f'{t:.3f}' for t in settled)}")

            await asyncio.sleep(1.0)
            ds_name = "nvidia-device-plugin-daemonset"
            generation = (sim.store.get("daemonsets", ds_name, NAMESPACE) or {})["metadata"][
                "generation"
            ]
            started = time.monotonic()
            sim.store.patch(
                "clusterpolicies.nvidia.com", "cluster-policy",
                {"spec": {"devicePlugin": {"env": [{"name": "LOG_LEVEL", "value": "debug"}]}}},
            )  # fmt: skip

            def updated() -> bool:
                ds = sim.store.get("daemonsets", ds_name, NAMESPACE) or {}
                return bool(ds.get("metadata", {}).get("generation", 0) > generation)

            await sim.wait_for(updated, 60, "DaemonSet updated")
            result["edit_s"] = time.monotonic() - started
            result["rss_mb"] = peak_rss_mb(operator.pid)
            result["kubesim_rss_mb"] = peak_rss_mb(os.getpid())
        finally:
            if sampler is not None:
                sampler.stop()  # idempotent; its timer signal would kill an unwinding run
                if sample is not None and not sample.exists():
                    sample.write_text(sampler.report(40, root=f"{ROOT}/") + "\n(run failed)\n")
            operator.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                operator.wait(60 if profile is not None else 10)
    if freezer is not None:
        freezer.cancel()
        gc.unfreeze()
    return result


def summarize(result: dict[str, Any]) -> list[str]:
    nodes = result["nodes"]
    converge = result["converge_requests"]
    node_patches = sum(n for (v, r), n in converge.items() if v == "patch" and r == "nodes")
    ds_writes = sum(
        n for (v, r), n in converge.items() if r == "daemonsets.apps" and v != "watch"
        and v not in ("get", "list")
    )  # fmt: skip
    node_gets = sum(n for (v, r), n in converge.items() if v == "get" and r == "nodes")
    steady = result["steady_requests"]
    steady_writes = sum(n for (v, _), n in steady.items() if v not in ("get", "list", "watch"))
    steady_lists = sum(n for (v, _), n in steady.items() if v == "list")
    joined = len(result["join_rollout_s"])

    def ms(values: list[float]) -> str:
        if not values:
            return "-"
        return f"p50 {statistics.median(values) * 1000:.0f} ms, max {max(values) * 1000:.0f} ms"

    return [
        f"| nodes (events {'on' if result['events'] else 'off'}) | {nodes} |",
        f"| operator start -> quiet, before any ClusterPolicy | {result['startup_s']:.1f} s "
        f"({result['startup_cpu_s']:.1f} s operator CPU) |",
        f"| ClusterPolicy created -> all states ready | {result['converge_s']:.1f} s "
        f"({result['converge_cpu_s']:.1f} s kubesim CPU, {result['operator_cpu_s']:.1f} s "
        f"operator CPU, {result['pods']} pods) |",
        f"| ClusterPolicy created -> operator quiet | {result['quiet_s']:.1f} s "
        f"({result['operator_quiet_cpu_s']:.1f} s operator CPU) |",
        "| event-loop stall while converging (p50 / p99 / max) | "
        + " / ".join(f"{v:.0f} ms" for v in result["stall_ms"])
        + " |",
        f"| node label patches per node | {node_patches / ((nodes + joined) or 1):.2f} "
        "(target <= 1) |",
        f"| DaemonSet writes | {ds_writes} |",
        f"| per-node GETs | {node_gets} (target 0) |",
        f"| steady state: writes / lists | {steady_writes} / {steady_lists} (target 0 / 0) |",
        f"| operator peak RSS | {result['rss_mb']:.0f} MB (target <= 150 at 5,000) |",
        f"| kubesim peak RSS | {result['kubesim_rss_mb']:.0f} MB |",
        f"| new GPU node -> labelled, settled | {ms(result['join_settled_s'])} |",
        f"| new GPU node -> labelled, during rollout | {ms(result['join_rollout_s'])} "
        f"({result['joins_while_rolling']} of {joined} while rolling) |",
        f"| ClusterPolicy edit -> DaemonSet updated | {result['edit_s'] * 1000:.0f} ms "
        "(target <= 1 s) |",
    ]


LEASE_RESOURCE = "leases.coordination.k8s.io"


def figures(result: dict[str, Any], steady: float) -> dict[str, float]:
    """The figures bench/history.jsonl keeps (all lower-is-better)."""
    per_min = 60.0 / steady if steady > 0 else 0.0
    requests = result["steady_requests"]

    def rate(match: Any) -> float:
        return sum(n for (verb, res), n in requests.items() if match(verb, res)) * per_min

    return {
        "converge_s": result["converge_s"],
        # CPU seconds are the robust figure on a shared machine (wall time varies with load).
        "operator_cpu_s": result["operator_cpu_s"],
        "operator_quiet_cpu_s": result["operator_quiet_cpu_s"],
        "kubesim_cpu_s": result["converge_cpu_s"],
        "startup_s": result["startup_s"],
        "startup_cpu_s": result["startup_cpu_s"],
        "steady_requests_per_min": rate(lambda v, r: True),
        "steady_lease_puts_per_min": rate(lambda v, r: v == "update" and r == LEASE_RESOURCE),
        "steady_reads_per_min": rate(lambda v, r: v in ("get", "list")),
        "steady_other_writes_per_min": rate(
            lambda v, r: v not in ("get", "list", "watch") and r != LEASE_RESOURCE
        ),
        "operator_rss_mb": result["rss_mb"],
        "join_settled_p50_s": statistics.median(result["join_settled_s"] or [0.0]),
        "edit_s": result["edit_s"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000, 5000])
    parser.add_argument("--steady", type=float, default=60.0, help="steady-state window (s)")
    parser.add_argument("--joins", type=int, default=10, help="new nodes per latency figure")
    parser.add_argument(
        "--no-events", action="store_true", help="run kubesim without recording Events"
    )
    parser.add_argument(
        "--default-gc", action="store_true", help="keep Python's default collector thresholds"
    )
    parser.add_argument(
        "--profile",
        type=Path,
        metavar="FILE",
        help="run the operator under cProfile and write its statistics to FILE "
        "(FILE.<nodes> with several sizes); read with `python -m pstats FILE`",
    )
    parser.add_argument(
        "--sample-kubesim",
        type=Path,
        metavar="FILE",
        help="sample this process (kubesim: API server and controllers) from ClusterPolicy to "
        "ready and write its top functions to FILE (FILE.<nodes> with several sizes)",
    )
    args = parser.parse_args()
    if not args.default_gc:
        # With the default thresholds the cyclic collector takes about half of the simulator's
        # CPU at thousands of nodes; fewer young passes (and freeze_survivors) keep it at ~5%.
        gc.set_threshold(50_000, 20, 100)

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    rows: list[str] = ["| figure | value |", "|---|---|"]
    for nodes in args.nodes:
        log(f"{nodes} GPU nodes:")
        tune_gc = not args.default_gc
        profile = args.profile
        if profile is not None and len(args.nodes) > 1:
            profile = profile.with_name(f"{profile.name}.{nodes}")
        sample = args.sample_kubesim
        if sample is not None and len(args.nodes) > 1:
            sample = sample.with_name(f"{sample.name}.{nodes}")
        result = asyncio.run(
            run_size(
                nodes,
                args.steady,
                args.joins,
                not args.no_events,
                log,
                tune_gc=tune_gc,
                profile=profile,
                sample=sample,
            )
        )
        rows.extend(summarize(result))
        per_min = 60.0 / args.steady if args.steady > 0 else 0.0
        log(
            "  steady state per minute: "
            + ", ".join(
                f"{verb} {res}={n * per_min:.0f}"
                for (verb, res), n in sorted(result["steady_requests"].items())
            )
        )
        history.append(
            "operator_scale",
            figures(result, args.steady),
            config={
                "nodes": nodes,
                "events": not args.no_events,
                "steady_s": args.steady,
                # cProfile slows the operator: its runs are compared only with each other.
                **({"profiled": True} if profile is not None else {}),
            },
        )
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
