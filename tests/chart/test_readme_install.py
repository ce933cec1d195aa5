"""The README's install and uninstall blocks, verbatim, against `scripts/demo --serve`'s cluster.

`scripts/demo` is set-up plus `gpu-operator demo`; the test runs the latter from the venv (the
set-up already happened: it installed helm and kubectl) with a small fleet and instant operands.
Slow (about 20 s).
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
from pathlib import Path

import pytest
import yaml

from .conftest import HELM, KUBECTL, ROOT, needs_helm

pytestmark = [
    needs_helm,
    pytest.mark.skipif(not KUBECTL.exists(), reason="kubectl not installed: run scripts/setup"),
    pytest.mark.slow,
]

GPU_OPERATOR = Path(sys.executable).parent / "gpu-operator"


def readme_block(marker: str) -> list[str]:
    """The commands of the README code block after `<!-- marker: ... -->`, continuations joined."""
    text = (ROOT / "README.md").read_text()
    match = re.search(rf"<!-- {marker}:[^>]*-->\n```bash\n(.*?)```", text, re.S)
    assert match, f"README.md has no `{marker}` block"
    return [c.strip() for c in match.group(1).replace("\\\n", " ").splitlines() if c.strip()]


async def shell(command: str, env: dict[str, str]) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_shell(
        command, cwd=ROOT, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(proc.communicate(), 300)
    return proc.returncode or 0, out.decode()


async def test_readme_install_and_uninstall_work_verbatim_on_the_served_demo(
    tmp_path: Path,
) -> None:
    kubeconfig = tmp_path / "gpu-operator-demo.yaml"
    demo = await asyncio.create_subprocess_exec(
        str(GPU_OPERATOR), "demo", "--serve", "--kubeconfig-out", str(kubeconfig),
        "--fleet", "small", "--time-scale", "0", "--no-live",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    seen: list[str] = []
    try:
        assert demo.stdout is not None
        async with asyncio.timeout(180):
            while not seen or "Press Ctrl-C to stop." not in seen[-1]:
                line = (await demo.stdout.readline()).decode()
                assert line, "".join(seen)
                seen.append(line)
        assert any("helm install" in line for line in seen), "".join(seen)
        env = {
            **os.environ,
            "PATH": f"{HELM.parent}:{os.environ['PATH']}",
            "KUBECONFIG": str(kubeconfig),
        }
        for command in readme_block("install"):
            code, out = await shell(command, env)
            assert code == 0, f"{command}\n{out}"
        assert "ready" in out  # `kubectl get clusterpolicy cluster-policy`, the block's last
        code, out = await shell("kubectl get nodes -o yaml", env)
        nodes = yaml.safe_load(out)["items"]
        assert any(n["metadata"]["labels"].get("nvidia.com/gpu.present") == "true" for n in nodes)
        for command in readme_block("uninstall"):
            code, out = await shell(command, env)
            assert code == 0, f"{command}\n{out}"
        code, out = await shell("kubectl get nodes -o yaml", env)
        for node in yaml.safe_load(out)["items"]:
            left = node["metadata"]["labels"]
            assert not [k for k in left if k.startswith(("nvidia.com/gpu", "feature.node"))], left
    finally:
        if demo.returncode is None:
            demo.send_signal(signal.SIGTERM)
            rest, _ = await asyncio.wait_for(demo.communicate(), 60)
            seen.append(rest.decode())
    assert demo.returncode == 0, "".join(seen)
