"""`gpu-operator demo` with a GPUCluster, as a user runs it: the summary says what the GPU DRA
driver published, and the output has no gRPC core log lines (its connection teardown at info
level when the demo stops the simulated kubelets and plugins)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_dra_demo_summary_counts_devices_and_prints_no_grpc_log_lines() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRPC_")}
    done = subprocess.run(
        [sys.executable, "-m", "gpu_operator", "demo", "--fleet", "dra",
         "--policy", str(ROOT / "examples" / "gpucluster-dra.yaml")],
        capture_output=True, text=True, env=env, timeout=300, check=False,
    )  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "  DRA devices:      8 gpu, 16 mig in ResourceSlices of 2 nodes (gpu.nvidia.com)" in out
    assert "chttp2_transport" not in out, out
    assert "GOAWAY" not in out, out
