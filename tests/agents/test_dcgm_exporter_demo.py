"""The seed documents' "Validate DCGM metrics" step on the demo cluster, with the real kubectl:
port-forward to the exporter pod and GET /metrics shows every GPU, the pod holding a GPU, and only
the counters of the seed's custom CSV; the seed's `metrics.csv` key spelling is reported.

The exporter, node status exporter, device plugin and GFD are the real agents on the node's mock
GPUs; a GPU pod's runner loads exactly its allocated GPU.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
from kubesim_helpers import KUBECTL, needs_kubectl
from rich.console import Console
from waiting import DEADLINE, within

import kubesim
from gpudemo import exporters, fleet, programs, session

pytestmark = needs_kubectl

NAMESPACE = session.NAMESPACE
NODE = "a100-1"
CM = "dcgm-exporter-config"
SEED_CSV = (
    "# GPU utilization\n"
    "DCGM_FI_DEV_GPU_UTIL, gauge, GPU utilization\n"
    "# Memory usage\n"
    "DCGM_FI_DEV_FB_USED, gauge, GPU memory used\n"
    "DCGM_FI_DEV_FB_FREE, gauge, GPU memory free\n"
)
JOB_IMAGE = "nvcr.io/nvidia/cloud-native/dcgm:4.2.3-1-ubuntu22.04"


def config_map(key: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": CM, "namespace": NAMESPACE},
        "data": {key: SEED_CSV},
    }


def demo_policy() -> dict[str, Any]:
    spec = {**session.DEFAULT_POLICY["spec"]}
    spec["dcgmExporter"] = {"enabled": True, "config": {"name": CM}}
    spec["nodeStatusExporter"] = {"enabled": True}
    return {**session.DEFAULT_POLICY, "spec": spec}


class Demo:
    def __init__(self, sim: kubesim.Cluster, nodes: programs.Programs, kubeconfig: Path) -> None:
        self.sim = sim
        self.nodes = nodes
        self.kubeconfig = kubeconfig
        self.background: list[asyncio.subprocess.Process] = []

    def env(self) -> dict[str, str]:
        # HOME too: without it kubectl writes its cache under ./.kube (the working directory).
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig)}

    async def kubectl(self, *args: str, stdin: str | None = None) -> str:
        proc = await asyncio.create_subprocess_exec(
            str(KUBECTL), *args,
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env=self.env(),
        )  # fmt: skip
        out, _ = await asyncio.wait_for(proc.communicate(stdin.encode() if stdin else None), 60)
        assert proc.returncode == 0, out.decode()
        return out.decode()

    async def port_forward(self, pod: str, port: int) -> int:
        """`kubectl port-forward -n gpu-operator <pod> :<port>`; returns the local port."""
        proc = await asyncio.create_subprocess_exec(
            str(KUBECTL), "port-forward", "-n", NAMESPACE, pod, f":{port}",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env=self.env(),
        )  # fmt: skip
        self.background.append(proc)
        assert proc.stdout is not None
        line = (await within(proc.stdout.readline(), f"port-forward to {pod}")).decode()
        found = re.match(rf"Forwarding from 127\.0\.0\.1:(\d+) -> {port}", line)
        assert found, line
        return int(found.group(1))

    def exporter_pod(self, app: str = exporters.DCGM_EXPORTER_APP) -> dict[str, Any] | None:
        for pod in self.sim.store.list("pods", NAMESPACE, label_selector=f"app={app}"):
            if pod["spec"].get("nodeName") == NODE and not pod["metadata"].get("deletionTimestamp"):
                return pod
        return None

    async def ready_exporter(self, app: str = exporters.DCGM_EXPORTER_APP) -> str:
        def ready() -> bool:
            pod = self.exporter_pod(app)
            conditions = ((pod or {}).get("status") or {}).get("conditions") or []
            return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

        await self.sim.wait_for(ready, DEADLINE, f"{app} pod ready on {NODE}")
        pod = self.exporter_pod(app)
        assert pod is not None
        return str(pod["metadata"]["name"])


@asynccontextmanager
async def served(tmp_path: Path) -> AsyncIterator[Demo]:
    ready: asyncio.Future[tuple[kubesim.Cluster, programs.Programs]] = (
        asyncio.get_running_loop().create_future()
    )
    buffer = io.StringIO()
    options = session.Options(
        fleet=fleet.parse({"pools": [{"name": "a100", "machine": "dgx-a100"}]}, "f.yaml"),
        policy=demo_policy(),
        objects=[config_map("dcgm-metrics.csv")],
        serve=True,
        kubeconfig_out=tmp_path / "kubeconfig",
        timing=programs.Timing(scale=0.0),
        timeout=60.0,
        live=False,
        on_serving=lambda sim, nodes: ready.set_result((sim, nodes)),
    )
    task = asyncio.ensure_future(session.run(options, Console(file=buffer, width=200)))
    demo: Demo | None = None
    try:
        done, _ = await asyncio.wait({task, ready}, timeout=90, return_when="FIRST_COMPLETED")
        assert ready in done, buffer.getvalue()
        demo = Demo(*ready.result(), tmp_path / "kubeconfig")
        yield demo
    finally:
        for proc in demo.background if demo else []:
            if proc.returncode is None:
                proc.terminate()
                await proc.wait()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def get(port: int, path: str = "/metrics") -> str:
    async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{port}{path}") as resp:
        assert resp.status == 200
        return await resp.text()


def gpu_job(name: str) -> str:
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {
                "containers": [
                    {
                        "name": "train",
                        "image": JOB_IMAGE,
                        # DCGM's load generator, installed in GPU containers by the demo.
                        "command": ["dcgmproftester12", "--no-dcgm-validation", "-d", "300"],
                        "resources": {"limits": {"nvidia.com/gpu": "1"}},
                    }
                ]
            },
        }
    )


async def test_seed_validate_dcgm_metrics_step_on_the_demo_cluster(tmp_path: Path) -> None:
    async with served(tmp_path) as demo:
        machine = demo.nodes.node(NODE).machine
        assert machine is not None
        # A GPU pod runs, then the exporter pod is replaced: its first collection includes it.
        await demo.kubectl("create", "-f", "-", stdin=gpu_job("trainer"))
        await demo.sim.wait_for(
            lambda: ((demo.sim.store.get("pods", "trainer", "default") or {}).get("status") or {})
            .get("phase") == "Running",
            DEADLINE,
            "trainer running",
        )  # fmt: skip
        old = await demo.ready_exporter()
        await demo.kubectl("delete", "pod", "-n", NAMESPACE, old, "--wait=false")
        await demo.sim.wait_for(
            lambda: (demo.exporter_pod() or {}).get("metadata", {}).get("name") not in (None, old),
            DEADLINE,
            "a new exporter pod",
        )
        pod = await demo.ready_exporter()

        port = await demo.port_forward(pod, 9400)
        text = await get(port)
        util = [line for line in text.splitlines() if line.startswith("DCGM_FI_DEV_GPU_UTIL{")]
        assert sorted(re.search(r'gpu="(\d)"', u).group(1) for u in util) == [  # type: ignore[union-attr]
            str(i) for i in range(8)
        ]
        # Only the seed's three counters (and no DCGM_FI_DRIVER_VERSION label: not in that CSV).
        assert re.findall(r"^# TYPE (\S+)", text, re.MULTILINE) == [
            "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED",
        ]  # fmt: skip
        assert "DCGM_FI_DRIVER_VERSION" not in text
        held = [u for u in util if 'pod="trainer"' in u]
        assert len(held) == 1, util
        assert 'container="train",namespace="default",pod="trainer"' in held[0]
        assert int(held[0].rsplit(" ", 1)[1]) > 50  # its runner loads exactly that GPU
        assert all(int(u.rsplit(" ", 1)[1]) < 10 for u in util if u is not held[0])
        assert await get(port, "/health") == "OK"

        # The node status exporter, replaced too so that its first poll (done before it serves)
        # sees the GPUs the device plugin advertises by now.
        status_app = exporters.NODE_STATUS_EXPORTER_APP
        old = await demo.ready_exporter(status_app)
        await demo.kubectl("delete", "pod", "-n", NAMESPACE, old, "--wait=false")
        await demo.sim.wait_for(
            lambda: (
                (demo.exporter_pod(status_app) or {}).get("metadata", {}).get("name")
                not in (None, old)
            ),
            DEADLINE,
            "a new node status exporter pod",
        )
        status_port = await demo.port_forward(await demo.ready_exporter(status_app), 8000)
        status = await get(status_port)
        assert f'gpu_operator_node_device_plugin_devices_total{{node="{NODE}"}} 8.0' in status
        assert f'gpu_operator_nvidia_pci_devices_total{{node="{NODE}"}} 8.0' in status
        assert f'gpu_operator_node_driver_validation{{node="{NODE}"}} 1.0' in status

        # The seed documents' own spelling of the key: reported, the running exporter kept.
        generation = demo.sim.store.get("daemonsets", exporters.DCGM_EXPORTER_APP, NAMESPACE)
        await demo.kubectl("replace", "-f", "-", stdin=json.dumps(config_map("metrics.csv")))

        def held_back() -> bool:
            policy = demo.sim.store.get("clusterpolicies.nvidia.com", session.POLICY_NAME) or {}
            states = (policy.get("status") or {}).get("states") or []
            return any(
                s["name"] == "state-dcgm-exporter" and s["state"] == "notReady"
                and "has no key dcgm-metrics.csv" in (s.get("message") or "")
                for s in states
            )  # fmt: skip

        await demo.sim.wait_for(held_back, DEADLINE, "state-dcgm-exporter held back")
        shown = await demo.kubectl(
            "get", "clusterpolicy", session.POLICY_NAME, "-o",
            "jsonpath={.status.states[?(@.name=='state-dcgm-exporter')].message}",
        )  # fmt: skip
        assert f"ConfigMap {CM} in namespace {NAMESPACE} has no key dcgm-metrics.csv" in shown
        assert "rename key metrics.csv to dcgm-metrics.csv" in shown
        # Events about the (cluster-scoped) ClusterPolicy live in `default`, as client-go puts them.
        events = await demo.kubectl("get", "events", "-n", "default")
        assert "ConfigMapKeyMissing" in events
        after = demo.sim.store.get("daemonsets", exporters.DCGM_EXPORTER_APP, NAMESPACE)
        assert generation is not None
        assert after is not None
        assert after["metadata"]["generation"] == generation["metadata"]["generation"]
        assert "DCGM_FI_DEV_GPU_UTIL" in await get(port)  # still serving

        # The load generator ends after its duration; a bad duration is a usage error.
        for name, duration in (("short", "1"), ("bad", "soon")):
            job = json.loads(gpu_job(name))
            job["spec"]["restartPolicy"] = "Never"
            job["spec"]["containers"][0]["command"] = ["dcgmproftester12", "-d", duration]
            await demo.kubectl("create", "-f", "-", stdin=json.dumps(job))
        for name, phase in (("short", "Succeeded"), ("bad", "Failed")):
            await demo.sim.wait_for(
                lambda name=name, phase=phase: (
                    ((demo.sim.store.get("pods", name, "default") or {}).get("status") or {}).get(
                        "phase"
                    )
                    == phase
                ),
                DEADLINE,
                f"{name} {phase}",
            )
        assert "Generating load on 1 GPU(s) for 1 s" in await demo.kubectl("logs", "short")
        assert "-d needs a positive number of seconds" in await demo.kubectl("logs", "bad")
