"""must-gather on a large kubesim cluster: wall time and archive size for N GPU nodes, each with
the four chain pods (driver, toolkit, device plugin, validator) as objects. Run:

    .venv/bin/python bench/must_gather_bench.py --nodes 1000
"""

from __future__ import annotations

import argparse
import asyncio
import time

import kubesim
from gpu_operator.api import crds, keys
from gpu_operator.kube import client as kube_client
from gpu_operator.kube import must_gather
from kubesim.controllers.kubelet import KubeletConfig

NAMESPACE = "gpu-operator"
APPS = ("nvidia-driver-daemonset", "nvidia-container-toolkit-daemonset",
        "nvidia-device-plugin-daemonset", "nvidia-operator-validator")  # fmt: skip


async def run(nodes: int) -> None:
    async with kubesim.Cluster(kubelet=KubeletConfig(instant=True), node_filesystems=False) as sim:
        sim.store.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        for crd in crds.all_crds().values():
            sim.store.create(crd)
        for i in range(nodes):
            name = f"gpu-{i}"
            sim.add_node(
                name,
                labels={
                    "feature.node.kubernetes.io/pci-10de.present": "true",
                    keys.GPU_PRESENT: "true",
                },
            )
            for app in APPS:
                sim.store.create(
                    {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "metadata": {
                            "name": f"{app}-{i}",
                            "namespace": NAMESPACE,
                            "labels": {"app": app},
                        },
                        "spec": {"nodeName": name, "containers": [{"name": "c", "image": "x"}]},
                    }
                )

        def running() -> bool:
            pods = sim.store.list("pods", NAMESPACE)
            return sum((p.get("status") or {}).get("phase") == "Running" for p in pods) == len(pods)

        await sim.wait_for(running, 600, "every pod running")
        client = kube_client.connect(str(sim.kubeconfig_path), timeout=120)
        start = time.monotonic()
        archive = await must_gather.gather(client, NAMESPACE)
        elapsed = time.monotonic() - start
        data = archive.tar_gz()
        await client.close()
        print(
            f"must-gather: {nodes} GPU nodes, {nodes * len(APPS)} pods: {elapsed:.1f} s, "
            f"{len(archive.files)} files, {len(data) / 1e6:.1f} MB compressed; "
            f"left out: {archive.left_out or 'nothing'}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=1000)
    asyncio.run(run(parser.parse_args().nodes))


if __name__ == "__main__":
    main()
