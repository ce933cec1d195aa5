"""`kubectl logs` of the demo's node agents shows paths as on a node (`/var/lib/kubelet/...`),
never the temporary tree where kubesim keeps each simulated node's files."""

from __future__ import annotations

from pathlib import Path

from demo_served import run_kubectl, serve_demo
from kubesim_helpers import needs_kubectl

from gpudemo import fleet

pytestmark = needs_kubectl
NS = "gpu-operator"
PLUGIN_APP = "nvidia-device-plugin-daemonset"


async def test_agent_logs_show_node_paths_not_the_simulations_temp_dir(tmp_path: Path) -> None:
    async with serve_demo(tmp_path, fleet.NAMED["small"]) as (sim, _, kubeconfig):
        code, plugin = await run_kubectl(
            kubeconfig, "-n", NS, "logs", "-l", f"app={PLUGIN_APP}", "--all-containers", "--prefix"
        )
        assert code == 0, plugin
        assert "serving nvidia.com/gpu on /var/lib/kubelet/device-plugins/nvidia-gpu.sock" in plugin
        assert "wrote CDI specs to /run/cdi" in plugin
        # No agent of any pod names where kubesim keeps the nodes' files.
        nodes_dir = str(sim.node_root("t4-1").parent)
        code, names = await run_kubectl(kubeconfig, "-n", NS, "get", "pods", "-o", "name")
        assert code == 0, names
        for pod in names.split():
            code, log = await run_kubectl(kubeconfig, "-n", NS, "logs", pod, "--all-containers")
            assert code == 0, log
            assert nodes_dir not in log, f"{pod}: {log}"
