"""The operator image's size and its programs' start times, measured from the built image.

    scripts/build-image --export build/image/rootfs
    .venv/bin/python bench/image_bench.py [--rootfs DIR] [--image IMAGE] [--runs 5]

Prints: the image's size as podman stores it (uncompressed layers) and the base's share, the
installed virtual environment, then per program the median wall time of `--version`/`--help`
(process start to exit, inside the unpacked image as scripts/image_smoke.py enters it), the time
until GFD has printed its labels, the device plugin has registered with a kubelet stand-in and
the exporter answers /metrics (mock backend, 8 GPUs), and those agents' resident memory once
serving. Needs root and podman (for the sizes; without podman only the rootfs figures print).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "src"))

import image_smoke  # noqa: E402
from image_smoke import AGENT_USER, MACHINE, SHARED, Rootfs  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import history  # noqa: E402  (bench/history.py, next to this script: runs append figures)

MIB = 1024 * 1024


def du(path: Path) -> int:
    done = subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True, check=True)
    return int(done.stdout.split()[0])


def podman_size(image: str) -> int | None:
    if shutil.which("podman") is None:
        return None
    done = subprocess.run(
        ["podman", "image", "inspect", "--format", "{{.Size}}", image],
        capture_output=True,
        text=True,
        check=False,
    )
    return int(done.stdout.strip()) if done.returncode == 0 else None


def base_of(image: str) -> str | None:
    """The base image scripts/build-image made (the newest `gpu-operator-base`)."""
    done = subprocess.run(
        ["podman", "image", "list", "--format", "{{.CreatedAt}}|{{.Repository}}:{{.Tag}}"],
        capture_output=True,
        text=True,
        check=False,
    )
    bases = sorted(
        (created, name)
        for created, name in (line.split("|", 1) for line in done.stdout.splitlines() if line)
        if "gpu-operator-base" in name
    )
    return bases[-1][1] if bases else None  # the newest: what the last build used


def median_seconds(run: Callable[[], None], runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.monotonic()
        run()
        times.append(time.monotonic() - start)
    return statistics.median(times)


def rss_mib(proc: subprocess.Popen[str]) -> float:
    """Resident memory of the program under unshare (its child), in MiB."""
    total = 0
    for pid in image_smoke._children(proc.pid):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1]) * 1024
    return total / MIB


def exporter(fs: Rootfs) -> tuple[float, float]:
    port = image_smoke._free_port()
    argv = ["dcgm-exporter", "--backend", "mock", "--machine", MACHINE]
    env = {"DCGM_EXPORTER_LISTEN": f"127.0.0.1:{port}", "NODE_NAME": "bench"}
    start = time.monotonic()
    with image_smoke._started(fs, argv, user=AGENT_USER, env=env) as proc:
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                    r.read()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() - start > 60:
                    raise RuntimeError("the exporter did not serve") from None
                time.sleep(0.02)
        ready = time.monotonic() - start
        return ready, rss_mib(proc)


def device_plugin(fs: Rootfs) -> tuple[float, float]:
    import grpc

    from kubeletapi.deviceplugin.v1beta1 import api_pb2 as pb
    from kubeletapi.deviceplugin.v1beta1 import api_pb2_grpc as pb_grpc

    shared = Path(tempfile.mkdtemp(prefix="dp-", dir="/tmp"))
    registered = asyncio.Event()

    class Kubelet(pb_grpc.RegistrationServicer):  # type: ignore[misc]
        async def Register(self, request: object, context: object) -> object:
            registered.set()
            return pb.Empty()

    async def main() -> tuple[float, float]:
        server = grpc.aio.server()
        pb_grpc.add_RegistrationServicer_to_server(Kubelet(), server)
        server.add_insecure_port(f"unix://{shared}/kubelet.sock")
        await server.start()
        argv = ["nvidia-device-plugin", "--backend=mock", f"--machine={MACHINE}"]
        env = {"KUBELET_SOCKET": f"{SHARED}/kubelet.sock", "DEVICE_PLUGIN_PATH": SHARED}
        try:
            start = time.monotonic()
            with image_smoke._started(fs, argv, user=AGENT_USER, env=env, shared=shared) as proc:
                await asyncio.wait_for(registered.wait(), 60)
                ready = time.monotonic() - start
                await asyncio.sleep(0.5)  # serving: its ListAndWatch streams are up
                return ready, rss_mib(proc)
        finally:
            await server.stop(0)

    try:
        return asyncio.run(main())
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rootfs", type=Path, default=ROOT / "build/image/rootfs")
    parser.add_argument("--image", default="localhost/gpu-operator:dev")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args(argv)
    if not args.rootfs.is_dir():
        print(f"no {args.rootfs}: run scripts/build-image --export {args.rootfs}", file=sys.stderr)
        return 2
    fs = Rootfs.open(args.rootfs)

    print("image")
    figures: dict[str, float] = {}
    size = podman_size(args.image)
    if size is not None:
        print(f"  {args.image} (podman, uncompressed): {size / MIB:7.1f} MiB")
        figures["image_mib"] = size / MIB
        base = base_of(args.image)
        base_size = podman_size(base) if base else None
        if base and base_size:
            print(f"  of which the base {base}: {base_size / MIB:7.1f} MiB")
    figures["rootfs_mib"] = du(args.rootfs) / MIB
    print(f"  unpacked root filesystem: {figures['rootfs_mib']:7.1f} MiB")
    venv = figures["venv_mib"] = du(args.rootfs / "opt/gpu-operator") / MIB
    print(f"  /opt/gpu-operator (venv, deps, agents): {venv:7.1f} MiB")

    print(f"start time (median of {args.runs}, in the unpacked image)")
    cases = [
        ("gpu-operator --version", ["gpu-operator", "--version"], None),
        ("gpu-operator agent --help", ["gpu-operator", "agent", "--help"], AGENT_USER),
        ("nvidia-device-plugin --help", ["nvidia-device-plugin", "--help"], AGENT_USER),
        ("nvidia-validator --help", ["nvidia-validator", "--help"], AGENT_USER),
        (
            "gpu-feature-discovery --oneshot (labels printed)",
            ["gpu-feature-discovery", "--oneshot", "--output-file=-", "--backend=mock",
             f"--machine={MACHINE}"],
            AGENT_USER,
        ),
    ]  # fmt: skip
    for label, command, user in cases:

        def once(command: list[str] = command, user: str | None = user) -> None:
            done = fs.run(command, user=user)
            if done.returncode != 0:
                raise RuntimeError(f"{command}: {done.stderr[-300:]}")

        took = figures[f"start_ms {label}"] = median_seconds(once, args.runs) * 1000
        print(f"  {label:52} {took:6.0f} ms")
    for label, measure in (
        ("nvidia-device-plugin: start -> registered", device_plugin),
        ("dcgm-exporter: start -> first /metrics", exporter),
    ):
        ready, rss = measure(fs)
        print(f"  {label:52} {ready * 1000:6.0f} ms  RSS {rss:5.1f} MiB")
        figures[f"ready_ms {label}"] = ready * 1000
        figures[f"rss_mib {label}"] = rss
    history.append("image", figures, config={"image": args.image, "runs": args.runs})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
