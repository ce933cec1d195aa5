"""The container toolkit's apply on big runtime configs: seconds per size, and the ratio that shows
whether the cost grows linearly with the config (target: linear; 30 MB in a few seconds).

Run: .venv/bin/python bench/toolkit_apply_bench.py [--runtime containerd|crio|docker|all]
     [--sizes 300K,3M,30M]
Each size is a node's config on disk (containerd: version 2 with our drop-in, whose CRI plugin
section holds thousands of registry mirrors and TLS settings, plus other plugins' sections; CRI-O:
crio.conf with as many runtimes and registries; Docker: daemon.json with as many mirrors and
runtimes), applied as a toolkit pod's first pass does it (backup saved, files written, flushed),
then checked again as the drift loop does. "s/MB" should stay flat from size to size: the last
column is each size's s/MB over the smallest's (1.0 is perfectly linear; the old editor's went
past 10).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from gpu_operator.agents.container_toolkit import backup, configure, runner, settings

sys.path.insert(0, str(Path(__file__).resolve().parent))
try:
    import history  # bench/history.py, next to this script: runs append their figures there
except ImportError:  # an older checkout without it
    history = None

HEAD = {
    "containerd": "version = 2\n"
    'root = "/var/lib/containerd"\n'
    'state = "/run/containerd"\n\n'
    '[plugins."io.containerd.grpc.v1.cri"]\n'
    '  sandbox_image = "registry.k8s.io/pause:3.10"\n\n'
    '[plugins."io.containerd.grpc.v1.cri".containerd]\n'
    '  default_runtime_name = "runc"\n\n'
    '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]\n'
    '  runtime_type = "io.containerd.runc.v2"\n\n'
    '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]\n'
    "  SystemdCgroup = true\n",
    "crio": "[crio.runtime]\n"
    'default_runtime = "crun"\n\n'
    "[crio.runtime.runtimes.crun]\n"
    'runtime_path = "/usr/bin/crun"\n'
    'runtime_type = "oci"\n',
}


def containerd_block(i: int) -> str:
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    return (
        f"\n# registry {i}: a mirror and its TLS settings\n"
        f'[{cri}.registry.mirrors."registry-{i}.example.com"]\n'
        f'  endpoint = ["https://mirror-{i}.example.com", "https://registry-{i}.example.com"]\n'
        f'[{cri}.registry.configs."registry-{i}.example.com".tls]\n'
        "  insecure_skip_verify = false\n"
        f'  ca_file = "/etc/containerd/certs/{i}.pem"\n'
        f'[plugins."io.containerd.monitor.v1.cgroups-{i}"]\n'
        "  no_prometheus = false\n"
    )


def crio_block(i: int) -> str:
    return (
        f"\n# runtime {i}\n"
        f"[crio.runtime.runtimes.kata-{i}]\n"
        f'runtime_path = "/opt/kata-{i}/bin/containerd-shim-kata-v2"\n'
        'runtime_type = "vm"\n'
        f'runtime_root = "/run/kata-{i}"\n'
        f'allowed_annotations = ["io.katacontainers.config.hypervisor.{i}"]\n'
    )


def config_of(runtime: str, size: int) -> bytes:
    """A config of about `size` bytes for `runtime`."""
    if runtime == "docker":
        mirrors: list[str] = []
        runtimes: dict[str, object] = {}
        length, i = 200, 0
        while length < size:
            mirrors.append(f"https://mirror-{i}.example.com")
            runtimes[f"kata-{i}"] = {"path": f"/opt/kata-{i}/bin/kata-runtime", "args": ["-d"]}
            length += 150
            i += 1
        body = {"registry-mirrors": mirrors, "runtimes": runtimes, "log-driver": "json-file"}
        return (json.dumps(body, indent=2) + "\n").encode()
    block = containerd_block if runtime == "containerd" else crio_block
    parts, length, i = [HEAD[runtime]], len(HEAD[runtime]), 0
    while length < size:
        parts.append(block(i))
        length += len(parts[-1])
        i += 1
    return "".join(parts).encode()


class Node:
    """A temp node with the runtime's config at its usual place, wired as the toolkit pod."""

    CONFIG = {
        "containerd": "/etc/containerd/config.toml",
        "crio": "/etc/crio/crio.conf",
        "docker": "/etc/docker/daemon.json",
    }
    DROP_IN = {
        "containerd": "/etc/containerd/conf.d/99-nvidia.toml",
        "crio": "/etc/crio/crio.conf.d/99-nvidia.conf",
    }

    def __init__(self, root: Path, runtime: str, data: bytes) -> None:
        self.root = root
        self.runtime = runtime
        config = self.CONFIG[runtime]
        env = {
            "RUNTIME": runtime,
            "RUNTIME_CONFIG": config,
            "CDI_ENABLED": "true",
            "CRIO_CONFIG_MODE": "config",
        }
        if runtime in self.DROP_IN:
            env["RUNTIME_DROP_IN_CONFIG"] = self.DROP_IN[runtime]
        self.settings = settings.from_env(env)
        path = self.view(config)
        path.parent.mkdir(parents=True)
        path.write_bytes(data)
        self.editor = runner.editor_for(self.settings)
        self.files = runner.runtime_files(self.settings, self.view)

    def view(self, path: str) -> Path:
        return self.root / path.lstrip("/")

    def apply(self, quick: bool) -> configure.Applied:
        store = backup.Store(self.view(self.settings.backup_dir), self.settings.backup_dir)
        return configure.apply(self.editor, self.files, store, self.runtime, quick=quick)


def timed(node: Node, quick: bool) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    node.apply(quick)
    return time.perf_counter() - wall, time.process_time() - cpu


def size_of(text: str) -> int:
    units = {"K": 1_000, "M": 1_000_000}
    return int(float(text[:-1]) * units[text[-1].upper()]) if text[-1].isalpha() else int(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runtime", default="containerd", help="containerd, crio, docker or all")
    parser.add_argument("--sizes", default="300K,3M,30M")
    args = parser.parse_args()
    runtimes = ["containerd", "crio", "docker"] if args.runtime == "all" else [args.runtime]
    labels = args.sizes.split(",")
    print(
        f"{'runtime':<11}{'size':>9}{'apply s':>10}{'cpu s':>9}{'s/MB':>8}{'drift s':>10}"
        f"{'ratio':>8}"
    )
    for runtime in runtimes:
        first: float | None = None
        figures: dict[str, float] = {}
        for label, size in zip(labels, map(size_of, labels), strict=True):
            data = config_of(runtime, size)
            root = Path(tempfile.mkdtemp(prefix="toolkit-bench-"))
            try:
                node = Node(root, runtime, data)
                wall, cpu = timed(node, False)
                drift, _ = timed(node, True)
            finally:
                shutil.rmtree(root, ignore_errors=True)
            per_mb = wall / (len(data) / 1e6)
            first = per_mb if first is None else first
            figures.update(
                {
                    f"apply_s_{label}": wall,
                    f"drift_s_{label}": drift,
                    f"ratio_{label}": per_mb / first,
                }
            )
            print(
                f"{runtime:<11}{len(data) / 1e6:>8.1f}M{wall:>10.2f}{cpu:>9.2f}{per_mb:>8.2f}"
                f"{drift:>10.3f}{per_mb / first:>8.2f}",
                flush=True,
            )
        if history is not None:
            history.append(
                "toolkit_apply", figures, config={"runtime": runtime, "sizes": args.sizes}
            )
    sys.exit(0)


if __name__ == "__main__":
    main()
