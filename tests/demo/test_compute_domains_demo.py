"""ComputeDomains end to end on the served demo, with the real kubectl: a GPUCluster with compute
domains on the `nvl72` fleet (scaled to racks of 4 GB200 trays); an MPI-style job of 4 pods with a
ComputeDomain of 4 nodes runs in one clique with the IMEX channel and the node's GPUs (`nvidia-smi
-q` shows the fabric) in every pod and the domain Ready; a 5th pod stays Pending with the
scheduler's reason; a node's fabric fault and a peer node going down show on the domain and in
`gpu-operator explain computedomain`; deleting the job removes the daemons and channels. A domain
of 5 nodes on racks of 4 runs the 4 pods that fit and says why the 5th cannot."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import yaml
from demo_served import run_kubectl, serve_demo
from kubesim_helpers import needs_kubectl
from waiting import eventually

from gpu_operator.api import computedomain as cdapi
from gpu_operator.nvml import protocol as p
from gpudemo import fleet

ROOT = Path(__file__).resolve().parents[2]
RACK_A = "6a1c3f2e-0b7d-4e59-9c21-72a8d4f0a001"
RACK_B = "6a1c3f2e-0b7d-4e59-9c21-72a8d4f0b002"

JOB = """
apiVersion: resource.nvidia.com/v1beta1
kind: ComputeDomain
metadata: {name: mpi-domain, namespace: default}
spec:
  numNodes: NUM
  channel:
    resourceClaimTemplate: {name: mpi-channel}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: mpi-gpus, namespace: default}
spec:
  spec:
    devices:
      requests:
      - name: gpus
        exactly: {deviceClassName: gpu.nvidia.com, allocationMode: All}
---
apiVersion: batch/v1
kind: Job
metadata: {name: mpi, namespace: default}
spec:
  completions: PODS
  parallelism: PODS
  completionMode: Indexed
  template:
    metadata:
      labels: {app: mpi}
    spec:
      restartPolicy: Never
      resourceClaims:
      - name: imex
        resourceClaimTemplateName: mpi-channel
      - name: gpus
        resourceClaimTemplateName: mpi-gpus
      containers:
      - name: worker
        image: ubuntu:22.04
        resources:
          claims:
          - name: imex
          - name: gpus
"""

EXTRA = """
apiVersion: v1
kind: Pod
metadata: {name: fifth, namespace: default, labels: {app: extra}}
spec:
  resourceClaims:
  - name: imex
    resourceClaimTemplateName: mpi-channel
  containers:
  - name: worker
    image: ubuntu:22.04
    resources:
      claims:
      - name: imex
"""


def racks_of_4() -> fleet.Fleet:
    """The `nvl72` fleet scaled to 8 nodes: two racks of 4 GB200 trays (580 drivers on the host)."""
    racks = fleet.scale(fleet.resolve("nvl72"), 8)
    assert [(p.name, p.count) for p in racks.pools if p.count] == [("rack-a", 4), ("rack-b", 4)]
    return racks


def job(num_nodes: int, pods: int) -> str:
    return JOB.replace("NUM", str(num_nodes)).replace("PODS", str(pods))


async def apply(kubeconfig: Path, tmp_path: Path, text: str) -> None:
    path = tmp_path / "apply.yaml"
    path.write_text(text)
    code, out = await run_kubectl(kubeconfig, "apply", "-f", str(path))
    assert code == 0, out


async def explain(kubeconfig: Path, name: str) -> tuple[int, str]:
    """`gpu-operator explain computedomain NAME` against the served demo."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gpu_operator", "explain", "computedomain", name,
        "--kubeconfig", str(kubeconfig),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode or 0, out.decode()


async def events_of(kubeconfig: Path, name: str) -> str:
    _, out = await run_kubectl(
        kubeconfig, "get", "events", "--field-selector", f"involvedObject.name={name}"
    )
    return out


def holds(check):  # type: ignore[no-untyped-def]
    """An async check that asserts, as a condition for `eventually` (falsy while it fails)."""

    async def condition():  # type: ignore[no-untyped-def]
        try:
            return (await check()) or True
        except AssertionError:
            return False

    return condition


async def get_json(kubeconfig: Path, *args: str) -> dict:  # type: ignore[type-arg]
    code, out = await run_kubectl(kubeconfig, "get", *args, "-o", "json")
    assert code == 0, out
    return json.loads(out)  # type: ignore[no-any-return]


async def running_pods(kubeconfig: Path, want: int) -> list:  # type: ignore[type-arg]
    pods = await get_json(kubeconfig, "pods", "-l", "app=mpi")
    running = [q for q in pods["items"] if q["status"].get("phase") == "Running"]
    assert len(running) == want, [q["status"].get("phase") for q in pods["items"]]
    return running


@needs_kubectl
async def test_mpi_job_in_one_clique_with_a_compute_domain(tmp_path: Path) -> None:
    policy = yaml.safe_load((ROOT / "examples/gpucluster-computedomains.yaml").read_text())
    async with serve_demo(tmp_path, racks_of_4(), policy=policy, timeout=120) as served:
        sim, nodes, kubeconfig = served
        await apply(kubeconfig, tmp_path, job(4, 4))

        async def domain_ready() -> dict:  # type: ignore[type-arg]
            cd = await get_json(kubeconfig, "computedomain", "mpi-domain")
            assert (cd.get("status") or {}).get("status") == cdapi.READY, cd.get("status")
            return cd

        cd = await eventually(holds(domain_ready), "the ComputeDomain to be Ready", timeout=90)
        nodes_status = cd["status"]["nodes"]
        assert len(nodes_status) == 4
        cliques = {n["cliqueID"] for n in nodes_status}
        assert len(cliques) == 1, cliques

        async def all_running() -> list:  # type: ignore[type-arg]
            return await running_pods(kubeconfig, 4)

        try:
            running = await eventually(holds(all_running), "the job's 4 pods to run", timeout=30)
        except AssertionError:
            _, described = await run_kubectl(kubeconfig, "describe", "pods", "-l", "app=mpi")
            raise AssertionError(described[-3000:]) from None
        assert {q["spec"]["nodeName"] for q in running} == {n["name"] for n in nodes_status}
        worker = running[0]["metadata"]["name"]
        code, out = await run_kubectl(
            kubeconfig, "exec", worker, "--", "ls", "/dev/nvidia-caps-imex-channels"
        )
        assert code == 0, out
        assert out.split() == ["channel0"], out
        # The pod's GPUs, with the rack's NVLink fabric.
        code, out = await run_kubectl(kubeconfig, "exec", worker, "--", "nvidia-smi", "-q")
        assert code == 0, out
        assert out.count("Fabric") == 4, out
        assert "State                             : Completed" in out, out
        assert cliques.pop().split(".")[0] in out, out
        code, out = await explain(kubeconfig, "mpi-domain")
        assert code == 0, out
        assert "ComputeDomain default/mpi-domain: Ready (4 of 4 node(s)" in out, out

        # A 5th pod with the domain's channel does not fit the clique: every channel of the
        # rack is taken, and the scheduler says so.
        await apply(kubeconfig, tmp_path, EXTRA)

        async def fifth_pending() -> None:
            pod = await get_json(kubeconfig, "pod", "fifth")
            assert pod["status"].get("phase") == "Pending", pod["status"]
            _, out = await run_kubectl(kubeconfig, "describe", "pod", "fifth")
            assert "FailedScheduling" in out, out
            assert "cannot allocate all claims" in out, out

        await eventually(holds(fifth_pending), "the 5th pod Pending with a reason", timeout=60)
        code, out = await run_kubectl(kubeconfig, "delete", "pod", "fifth", "--wait=true")
        assert code == 0, out

        # A fabric fault on one of the job's nodes shows on the domain.
        node = nodes_status[0]["name"]
        machine = nodes.nodes[node].machine
        assert machine is not None
        machine.set_fabric(health_mask=p.fabric_health_mask(route_unhealthy=True))

        async def reported() -> None:
            got = await get_json(kubeconfig, "computedomain", "mpi-domain")
            assert got["status"]["status"] == cdapi.NOT_READY
            row = next(n for n in got["status"]["nodes"] if n["name"] == node)
            assert row["status"] == cdapi.NOT_READY
            out = await events_of(kubeconfig, "mpi-domain")
            assert "NVLinkFabricDegraded" in out, out
            assert node in out, out

        await eventually(holds(reported), "the fault on the ComputeDomain", timeout=60)
        code, out = await explain(kubeconfig, "mpi-domain")
        assert code == 1, out
        assert "NotReady" in out, out
        assert "NVLinkFabricDegraded" in out, out
        machine.set_fabric(health_mask=p.fabric_health_mask())

        # A peer node goes down: the other daemons cannot reach it.
        peer = nodes_status[1]["name"]
        sim.set_node_ready(peer, False)
        nodes.imex_network.set_up(peer, False)

        async def peer_reported() -> None:
            got = await get_json(kubeconfig, "computedomain", "mpi-domain")
            assert got["status"]["status"] == cdapi.NOT_READY
            out = await events_of(kubeconfig, "mpi-domain")
            assert "IMEXPeerUnreachable" in out, out
            assert f"peer {peer}" in out, out

        await eventually(holds(peer_reported), "the down peer on the ComputeDomain", timeout=60)
        code, out = await explain(kubeconfig, "mpi-domain")
        assert code == 1, out
        assert "IMEXPeerUnreachable" in out, out
        sim.set_node_ready(peer, True)
        nodes.imex_network.set_up(peer, True)

        code, out = await run_kubectl(kubeconfig, "delete", "job", "mpi", "--wait=true")
        assert code == 0, out

        async def gone() -> None:
            daemons = await get_json(kubeconfig, "pods", "-A", "-l", cdapi.DOMAIN_LABEL)
            assert daemons["items"] == [], [d["metadata"]["name"] for d in daemons["items"]]
            labelled = await get_json(kubeconfig, "nodes", "-l", cdapi.DOMAIN_LABEL)
            assert labelled["items"] == []

        await eventually(holds(gone), "daemons and channels to go", timeout=60)


@needs_kubectl
async def test_a_domain_larger_than_a_clique_runs_what_fits_and_says_why(tmp_path: Path) -> None:
    """numNodes 5 and 5 pods on racks of 4 trays: 4 pods run in one rack, the 5th stays Pending
    with the scheduler's reason, and the domain's NoCliqueFits Event names the cliques' sizes."""
    policy = yaml.safe_load((ROOT / "examples/gpucluster-computedomains.yaml").read_text())
    async with serve_demo(tmp_path, racks_of_4(), policy=policy, timeout=120) as served:
        _, _, kubeconfig = served
        await apply(kubeconfig, tmp_path, job(5, 5))

        async def four_run_one_waits() -> None:
            pods = await get_json(kubeconfig, "pods", "-l", "app=mpi")
            phases = sorted(q["status"].get("phase") for q in pods["items"])
            assert phases == ["Pending", "Running", "Running", "Running", "Running"], phases
            pending = next(q for q in pods["items"] if q["status"].get("phase") == "Pending")
            _, out = await run_kubectl(kubeconfig, "describe", "pod", pending["metadata"]["name"])
            assert "cannot allocate all claims" in out, out

        await eventually(holds(four_run_one_waits), "4 pods running, 1 Pending", timeout=90)
        out = await events_of(kubeconfig, "mpi-domain")
        assert "NoCliqueFits" in out, out
        got = await get_json(kubeconfig, "computedomain", "mpi-domain")
        assert got["status"]["status"] == cdapi.NOT_READY
        code, out = await explain(kubeconfig, "mpi-domain")
        assert code == 1, out
        assert "numNodes 5 does not fit in one NVLink clique" in out, out
        assert f"{RACK_A}.32766: 4" in out, out
        assert f"{RACK_B}.32766: 4" in out, out
