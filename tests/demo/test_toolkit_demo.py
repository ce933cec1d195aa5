"""The container toolkit agent on the demo, as a user sees it: `helm install` configures each
GPU node's containerd (the runtime then serves the NVIDIA handlers), `kubectl logs` of the
toolkit pod says what changed, `helm uninstall` leaves the node's config.toml byte-identical to
what it booted with, and an edit behind the toolkit's back is noticed, re-applied and announced."""

from __future__ import annotations

import asyncio
import io
import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from waiting import DEADLINE, eventually

import kubesim
from gpudemo import fleet, install, programs, session

ROOT = Path(__file__).resolve().parents[2]
KUBECTL = ROOT / ".tools" / "bin" / "kubectl"
HELM = ROOT / ".tools" / "bin" / "helm"
pytestmark = pytest.mark.skipif(
    not KUBECTL.exists(), reason="kubectl not installed (scripts/setup)"
)

CONFIG = "etc/containerd/config.toml"
DROP_IN = "etc/containerd/conf.d/99-nvidia.toml"
NVIDIA_HANDLERS = {"nvidia", "nvidia-cdi", "nvidia-legacy"}


@dataclass
class Served:
    sim: kubesim.Cluster
    nodes: programs.Programs
    kubeconfig: Path

    async def kubectl(self, *args: str) -> str:
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig)}
        proc = await asyncio.create_subprocess_exec(
            str(KUBECTL),
            *args,
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        out, _ = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0, out.decode()
        return out.decode()

    def file(self, node: str, path: str) -> Path:
        return self.sim.node_root(node) / path

    def toolkit_pods(self) -> list[dict[str, Any]]:
        return [
            p
            for p in self.sim.store.list("pods", session.NAMESPACE)
            if (p["metadata"].get("labels") or {}).get("app")
            == "nvidia-container-toolkit-daemonset"
        ]

    def toolkit_pod(self, node: str) -> str:
        for pod in self.toolkit_pods():
            if pod["spec"].get("nodeName") == node:
                return str(pod["metadata"]["name"])
        raise AssertionError(f"no toolkit pod on {node}")

    async def until(
        self,
        condition: Callable[[], bool],
        what: str,
        timeout: float = DEADLINE,
        shown: Callable[[], str] | None = None,
    ) -> None:
        await eventually(condition, what, timeout=timeout, interval=0.05, state=shown)


@asynccontextmanager
async def served(tmp_path: Path, **extra: Any) -> AsyncIterator[Served]:
    ready: asyncio.Future[tuple[kubesim.Cluster, programs.Programs]] = (
        asyncio.get_running_loop().create_future()
    )
    buffer = io.StringIO()
    options = session.Options(
        fleet=fleet.parse(
            {"pools": [{"name": "a100", "machine": "dgx-a100"}, {"name": "cpu"}]}, "toolkit.yaml"
        ),
        serve=True,
        kubeconfig_out=tmp_path / "kubeconfig",
        timing=programs.Timing(scale=0.0),
        timeout=90.0,
        live=False,
        on_serving=lambda sim, nodes: ready.set_result((sim, nodes)),
        **extra,
    )
    task = asyncio.ensure_future(session.run(options, Console(file=buffer, width=200)))
    try:
        done, _ = await asyncio.wait({task, ready}, timeout=150, return_when="FIRST_COMPLETED")
        assert ready in done, buffer.getvalue()
        sim, nodes = ready.result()
        yield Served(sim, nodes, tmp_path / "kubeconfig")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def original_config(demo: Served, node: str) -> bytes:
    """What the node booted with, as the toolkit saved it before its first edit."""
    return demo.file(node, "usr/local/nvidia/runtime-config-backup/config.orig").read_bytes()


@pytest.mark.slow
@pytest.mark.skipif(not HELM.exists(), reason="helm not installed: run scripts/setup")
async def test_helm_install_configures_containerd_and_uninstall_restores_it_byte_for_byte(
    tmp_path: Path,
) -> None:
    async with served(tmp_path, install="helm") as demo:
        node = "a100-1"
        runtime = demo.nodes.runtime(node)
        assert runtime is not None
        assert set(runtime.handlers()) >= NVIDIA_HANDLERS
        assert runtime.enable_cdi
        original = original_config(demo, node)
        assert b"conf.d/*.toml" not in original
        assert b"/etc/containerd/conf.d/*.toml" in demo.file(node, CONFIG).read_bytes()
        assert demo.file(node, DROP_IN).is_file()

        logs = await demo.kubectl("-n", session.NAMESPACE, "logs", demo.toolkit_pod(node))
        assert "saved the original runtime config in" in logs
        assert "added runtime handler nvidia-cdi" in logs
        assert (
            "added /etc/containerd/conf.d/*.toml to the imports of /etc/containerd/config.toml"
            in logs
        )
        assert "wrote the management CDI spec /var/run/cdi/management.nvidia.com-gpu.yaml" in logs
        assert "restarting containerd" in logs
        described = await demo.kubectl("describe", "node", node)
        assert "RuntimeConfigured" in described

        helm = install.Helm(demo.kubeconfig)
        code, out = await helm.run("uninstall", helm.release, "--wait", "--timeout", "120s")
        assert code == 0, out
        await demo.until(lambda: not demo.toolkit_pods(), "the toolkit pods to go")
        await demo.until(lambda: not demo.file(node, DROP_IN).exists(), "the drop-in to go")
        assert demo.file(node, CONFIG).read_bytes() == original
        assert not demo.file(node, "var/run/cdi/management.nvidia.com-gpu.yaml").exists()
        assert not demo.file(node, "usr/local/nvidia/runtime-config-backup").exists()
        assert not NVIDIA_HANDLERS & set(runtime.handlers())


async def test_an_edit_behind_the_toolkits_back_is_re_applied_with_an_event(tmp_path: Path) -> None:
    async with served(tmp_path) as demo:
        node = "a100-1"
        config = demo.file(node, CONFIG)
        ours = config.read_bytes()
        # A node-image update rewrites config.toml without the toolkit's imports line.
        updated = original_config(demo, node).replace(b"oom_score = 0", b"oom_score = -999")
        # Replaced at once, as an image update would: the agent reads the file in a thread, and
        # a write in place could show it the emptied file in between (then it rewrites that).
        staged = config.with_name(config.name + ".new")
        staged.write_bytes(updated)
        os.replace(staged, config)
        await demo.until(lambda: b"conf.d/*.toml" in config.read_bytes(), "the import again")
        assert b"oom_score = -999" in config.read_bytes()
        assert config.read_bytes() != ours

        async def drift_event() -> str:
            return await demo.kubectl(
                "get",
                "events",
                "-A",
                "--field-selector",
                "reason=RuntimeConfigDrift",
                "-o",
                "custom-columns=TYPE:.type,OBJ:.involvedObject.name,MSG:.message",
            )

        last = [""]

        async def drifted() -> bool:
            last[0] = await drift_event()
            return node in last[0]

        await eventually(
            drifted, f"a RuntimeConfigDrift Event for {node}", interval=0.2, state=lambda: last[0]
        )
        events = last[0]
        assert "Warning" in events, events
        assert "/etc/containerd/config.toml: added /etc/containerd/conf.d/*.toml" in events
        logs = await demo.kubectl("-n", session.NAMESPACE, "logs", demo.toolkit_pod(node))
        assert "runtime config drift in /etc/containerd/config.toml" in logs
        assert "now what uninstall restores" in logs
        runtime = demo.nodes.runtime(node)
        assert runtime is not None
        assert set(runtime.handlers()) >= NVIDIA_HANDLERS


async def test_an_unwritable_runtime_config_fails_the_toolkit_and_the_policy_names_it(
    tmp_path: Path,
) -> None:
    async with served(tmp_path) as demo:
        node = "a100-1"
        # The drop-in's path becomes a directory (a broken node image): no toolkit can write its
        # settings there. (The test shares the demo's event loop: nothing runs in between.)
        drop_in = demo.file(node, DROP_IN)
        drop_in.unlink()
        drop_in.mkdir()
        await demo.kubectl(
            "-n", session.NAMESPACE, "delete", "pod", demo.toolkit_pod(node), "--wait=false"
        )

        def toolkit_status() -> str:
            policy = demo.sim.store.get("clusterpolicies.nvidia.com", session.POLICY_NAME) or {}
            for state in (policy.get("status") or {}).get("states") or []:
                if state.get("name") == "state-container-toolkit":
                    return f"{state.get('state')}: {state.get('message', '')}"
            return ""

        await demo.until(
            lambda: "configuring containerd failed" in toolkit_status(),
            "the ClusterPolicy status names the toolkit's failure",
            shown=toolkit_status,
        )
        status = toolkit_status()
        assert status.startswith("notReady"), status
        assert node in status, status
        assert "99-nvidia.toml" in status, status
        described = await demo.kubectl(
            "-n", session.NAMESPACE, "describe", "pod", demo.toolkit_pod(node)
        )
        assert "configuring containerd failed" in described, described
