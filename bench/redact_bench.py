"""must-gather's redaction (gpu_operator.kube.redact): seconds per MB of log text, realistic and
adversarial, at two sizes (the time per MB stays flat when the cost is linear), and the object
walk over a large pod list. Run:

    .venv/bin/python bench/redact_bench.py --mb 4 --pods 20000
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path
from typing import Any

from gpu_operator.kube import redact

sys.path.insert(0, str(Path(__file__).resolve().parent))
import history  # bench/history.py, next to this script: runs append their figures there

DIGEST = "sha256:" + "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
LINES = (
    'I0101 10:00:00.000000       1 reconcile.go:42] "Reconciling" node="gpu-{i}" '
    'resourceVersion="{i}" uid="6f1c0a0e-1d2b-4c3d-9e8f-0a1b2c3d4e5f"',
    '{{"level":"info","ts":"2026-01-01T10:00:00Z","msg":"pulled","image":"nvcr.io/nvidia/driver@'
    + DIGEST
    + '","gpu":"GPU-3f1a2b3c-1234-5678-9abc-def012345678"}}',
    'time="2026-01-01T10:00:00Z" level=info msg="device 00000000:3B:00.0 healthy" count={i}',
    "starting nvidia-driver-ctr --kernel-module-type=auto --driver-version=580.95.05",
    "GET https://nvcr.io/v2/nvidia/driver/manifests/580?token=Tok{i}abc&scope=repo "
    "Authorization: Bearer Tok{i}.def",
)
# Inputs built to make a backtracking pattern or a rescan quadratic, repeated to the size asked.
ADVERSARIAL = {
    "one long word": "a",
    "key= repeated": "a=",
    "token: repeated": "token: ",
    "BEGIN PRIVATE KEY, no END": "-----BEGIN PRIVATE KEY-----\n",
    "END PRIVATE KEY, no BEGIN": "x\n-----END PRIVATE KEY-----",
    "unterminated quotes": 'password: "',
    "scheme://user: repeated": "a://b:",
    "--password repeated": "--password ",
    "base64 JSON prefix repeated": "eyJhdXRocyI6",
    "Authorization: on one line": "Authorization: ",
    "Cookie: on one line": "Cookie: a=b;",
    "env entries": "name: X_TOKEN\nvalue: ",
    "YAML blocks": "password: |\n  x\n",
}


def realistic(size: int) -> str:
    rng = random.Random(1)
    out: list[str] = []
    total = 0
    i = 0
    while total < size:
        line = rng.choice(LINES).format(i=i)
        out.append(line)
        total += len(line) + 1
        i += 1
    return "\n".join(out)[:size]


def per_mb(text: str) -> float:
    start = time.perf_counter()
    redact.redact_text(text)
    return (time.perf_counter() - start) / (len(text) / 1e6)


def pod(i: int) -> dict[str, Any]:
    image = "nvcr.io/nvidia/driver:580.95.05-ubuntu22.04"
    env = [
        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "DRIVER_VERSION", "value": "580.95.05"},
    ]
    status = {
        "name": "nvidia-driver-ctr", "ready": True, "image": image,
        "imageID": f"nvcr.io/nvidia/driver@{DIGEST}", "containerID": f"containerd://{i:064d}",
    }  # fmt: skip
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": f"nvidia-driver-daemonset-{i}", "namespace": "gpu-operator",
                     "uid": f"6f1c0a0e-1d2b-4c3d-9e8f-{i:012d}", "resourceVersion": str(i),
                     "labels": {"app": "nvidia-driver-daemonset"}},
        "spec": {"nodeName": f"gpu-{i}", "containers": [
            {"name": "nvidia-driver-ctr", "image": image, "args": ["init"], "env": env}]},
        "status": {"phase": "Running", "podIP": f"10.0.{i // 256 % 256}.{i % 256}",
                   "containerStatuses": [status]},
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mb", type=float, default=4.0, help="text size (and twice that)")
    parser.add_argument("--pods", type=int, default=20000)
    args = parser.parse_args()
    size = int(args.mb * 1e6)
    print(f"{'input':30} {args.mb:>5g} MB s/MB {2 * args.mb:>5g} MB s/MB")
    inputs = {"realistic log": realistic(2 * size)}
    inputs.update({name: unit * (2 * size // len(unit) + 1) for name, unit in ADVERSARIAL.items()})
    figures: dict[str, float] = {}
    for name, text in inputs.items():
        small, large = per_mb(text[:size]), per_mb(text[: 2 * size])
        print(f"{name:30} {small:13.2f} {large:13.2f}")
        figures[f"s_per_mb {name}"] = large
    pods = [pod(i) for i in range(args.pods)]
    start = time.perf_counter()
    redact.redact_value(pods)
    figures["pods_s"] = time.perf_counter() - start
    print(f"{args.pods} pods (redact_value): {figures['pods_s']:.2f} s")
    history.append("redact", figures, config={"mb": args.mb, "pods": args.pods})


if __name__ == "__main__":
    main()
