"""The operator image, built for real from the Dockerfile (scripts/build-image: podman with a
Debian base made by mmdebstrap) and run from its unpacked root filesystem
(scripts/image_smoke.py): `gpu-operator --version` as its user, every NVIDIA-named entry point,
the device plugin, GFD and exporter on the mock backend, and every program the operand renderers
start in a container of this image (the chart with `agents.builtin=true`, and the guard next to
NVIDIA's toolkit by default) found on its PATH. Skipped, with the reason, without podman or root."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from builtin_commands import HELM, programs, rendered_operands

from gpu_operator.agents import entrypoints
from gpu_operator.cli.render import CHART_OPERATOR_ENV

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import image_smoke  # noqa: E402

IMAGE = "localhost/gpu-operator:test"
TOOLS = ("podman", "buildah", "mmdebstrap", "unshare", "chroot")
MISSING = [tool for tool in TOOLS if shutil.which(tool) is None]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        bool(MISSING),
        reason=f"{', '.join(MISSING)} not installed: scripts/build-image installs them on Debian "
        "(apt-get install podman buildah mmdebstrap)",
    ),
    pytest.mark.skipif(os.geteuid() != 0, reason="building and entering the image needs root"),
    pytest.mark.skipif(not HELM.exists(), reason="helm not installed: run scripts/setup"),
]


def test_the_image_builds_runs_its_agents_and_has_every_rendered_command(tmp_path: Path) -> None:
    rootfs = tmp_path / "rootfs"
    done = subprocess.run(
        [str(ROOT / "scripts" / "build-image"), "--export", str(rootfs)],
        env={**os.environ, "IMAGE": IMAGE},
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    fs = image_smoke.Rootfs.open(rootfs)
    assert fs.user == "65532:65532"
    assert fs.config["Entrypoint"] == ["gpu-operator"]

    failed = [f"{c.name}: {c.detail}" for c in image_smoke.smoke(fs) if not c.ok]
    assert failed == []

    ours = CHART_OPERATOR_ENV["OPERATOR_IMAGE"]
    needed = {
        **programs(rendered_operands(), ours),  # every builtin agent
        **programs(rendered_operands("agents.builtin=false"), ours),  # the runtime-config guard
    }
    assert {"gpu-operator", "nvidia-device-plugin", "nvidia-validator"} <= set(needed)
    names = sorted({*needed, *entrypoints.NAMES})
    script = "; ".join(f'command -v {n} >/dev/null || echo "missing {n}"' for n in names)
    found = fs.run(["sh", "-c", script], user="0:0")
    assert found.returncode == 0, found.stderr
    assert found.stdout == "", {
        line.split()[1]: sorted(needed.get(line.split()[1], ()))
        for line in found.stdout.split("\n")
        if line
    }
