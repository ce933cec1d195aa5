"""The runtime-config guard with NVIDIA's toolkit on the demo (`--nvidia-toolkit`): NVIDIA's
toolkit rewrites /etc/containerd/config.toml in place (re-serialised, its runtimes added) and
never puts it back; the guard's init container saved the original before, and its native sidecar,
which Kubernetes stops after the toolkit container, restores it byte for byte on `helm uninstall`.
Without the guard (`toolkit.runtimeConfigGuard=false`) the node keeps NVIDIA's rewrite, which is
the AKS warning the guard answers."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_toolkit_demo import CONFIG, HELM, NVIDIA_HANDLERS, Served, served

from gpudemo import install, session
from simhost import runtime_boot

NODE = "a100-1"
ORIGINAL = runtime_boot.ORIGINALS["containerd-2"]["/" + CONFIG]
GUARD_DIR = "usr/local/nvidia/runtime-config-guard"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not HELM.exists(), reason="helm not installed: run scripts/setup"),
]


async def _uninstall(demo: Served) -> None:
    helm = install.Helm(demo.kubeconfig)
    code, out = await helm.run("uninstall", helm.release, "--wait", "--timeout", "120s")
    assert code == 0, out
    await demo.until(lambda: not demo.toolkit_pods(), "the toolkit pods to go")


async def test_nvidia_toolkit_rewrites_the_config_and_the_guard_restores_it_byte_for_byte(
    tmp_path: Path,
) -> None:
    async with served(tmp_path, install="helm", nvidia_toolkit=True) as demo:
        config = demo.file(NODE, CONFIG)
        runtime = demo.nodes.runtime(NODE)
        assert runtime is not None
        assert set(runtime.handlers()) >= NVIDIA_HANDLERS
        rewritten = config.read_text()
        assert rewritten != ORIGINAL
        assert "'" not in rewritten  # re-serialised: the node's single-quoted style is gone
        assert demo.file(NODE, f"{GUARD_DIR}/config.orig").read_text() == ORIGINAL
        logs = await demo.kubectl(
            "-n", session.NAMESPACE, "logs", demo.toolkit_pod(NODE), "-c", "runtime-config-save"
        )
        assert f"saved /{CONFIG}" in logs

        await _uninstall(demo)
        assert config.read_text() == ORIGINAL
        assert config.read_bytes() == ORIGINAL.encode()
        assert not demo.file(NODE, GUARD_DIR).exists()
        assert not NVIDIA_HANDLERS & set(runtime.handlers())


async def test_without_the_guard_nvidia_toolkit_leaves_its_rewrite_behind(tmp_path: Path) -> None:
    async with served(
        tmp_path,
        install="helm",
        nvidia_toolkit=True,
        sets=["toolkit.runtimeConfigGuard=false"],
    ) as demo:
        config = demo.file(NODE, CONFIG)
        assert not demo.file(NODE, GUARD_DIR).exists()
        rewritten = config.read_text()
        assert rewritten != ORIGINAL
        await _uninstall(demo)
        assert config.read_text() == rewritten  # NVIDIA's toolkit does not put it back
