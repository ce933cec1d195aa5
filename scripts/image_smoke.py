"""Run the built operator image's programs from its unpacked root filesystem (docs/image.md).

`podman run` is refused on our machines (the sandbox denies the OCI runtime its rlimits), so the
image's root filesystem (`scripts/build-image --export DIR`) is entered with `unshare` (a mount
and a PID namespace: /dev and a fresh /proc inside) and `chroot`, with the image's environment
and user. This is what a container runtime does minus cgroups, capabilities and seccomp, which
none of these checks depend on.

    .venv/bin/python scripts/image_smoke.py build/image/rootfs     # PASS/FAIL per check

Checks: `gpu-operator --version` as the image's user; every NVIDIA-named entry point's `--help`
(`gpu_operator.agents.entrypoints`); GFD on the mock backend (labels to stdout); the device plugin
on the mock backend registering with a kubelet stand-in served from the host and listing 8 GPUs
over its gRPC socket; the exporter on the mock backend serving /metrics. Needs root.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from gpu_operator.agents import entrypoints  # noqa: E402

MACHINE = "dgx-a100"  # 8 A100s
AGENT_USER = "0:0"  # node agents run as root (operands/builtin.py)
# Inside the rootfs: a directory the host shares for sockets (short paths: sun_path is 108 bytes).
SHARED = "/run/smoke"


@dataclass
class Rootfs:
    """An unpacked image: its root directory and its config (`Env`, `User`, `WorkingDir`)."""

    path: Path
    config: Mapping[str, Any]

    @classmethod
    def open(cls, path: Path) -> Rootfs:
        config_file = path.with_name(path.name + ".config.json")
        config = json.loads(config_file.read_text()) if config_file.is_file() else {}
        return cls(path.resolve(), config)

    @property
    def user(self) -> str:
        return str(self.config.get("User") or "0:0")

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        found = dict(e.split("=", 1) for e in self.config.get("Env") or [] if "=" in e)
        found.setdefault("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
        found.setdefault("HOME", "/tmp")
        found.update(extra or {})
        return found

    def command(
        self,
        argv: Sequence[str],
        *,
        user: str | None = None,
        env: Mapping[str, str] | None = None,
        shared: Path | None = None,
    ) -> list[str]:
        """`argv` in the image: own mount and PID namespaces, /dev and /proc, then chroot."""
        workdir = str(self.config.get("WorkingDir") or "/")
        binds = ['mount --rbind /dev "$R/dev"', 'mount -t proc proc "$R/proc"']
        if shared is not None:
            binds.append(f'mkdir -p "$R{SHARED}" && mount --bind "{shared}" "$R{SHARED}"')
        script = (
            'set -e; R="$0"; '
            + "; ".join(binds)
            + f'; cd "$R{workdir}"; exec chroot --userspec="{user or self.user}" "$R" '
            + "/usr/bin/env -i "
            + " ".join(f"{k}={_quote(v)}" for k, v in self.env(env).items())
            + ' "$@"'
        )
        return [
            "unshare", "--mount", "--pid", "--fork", "--kill-child=SIGTERM", "--",
            "sh", "-c", script, str(self.path), *argv,
        ]  # fmt: skip

    def run(
        self, argv: Sequence[str], *, timeout: float = 60, **kwargs: Any
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.command(argv, **kwargs), capture_output=True, text=True, timeout=timeout
        )


def _quote(value: str) -> str:
    return "'" + value.replace("'", "'\\''") + "'"


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    seconds: float


def check_version(fs: Rootfs) -> Check:
    start = time.monotonic()
    done = fs.run(["gpu-operator", "--version"])  # as the image's own user (65532)
    out = done.stdout.strip()
    return Check(
        f"gpu-operator --version (user {fs.user})",
        done.returncode == 0 and out.startswith("gpu-operator "),
        out or done.stderr.strip()[-300:],
        time.monotonic() - start,
    )


def check_help(fs: Rootfs, name: str) -> Check:
    start = time.monotonic()
    done = fs.run([name, "--help"], user=AGENT_USER, env={"COLUMNS": "100"})
    usage = f"Usage: {name}"
    return Check(
        f"{name} --help",
        done.returncode == 0 and usage in done.stdout,
        f"-> gpu-operator agent {entrypoints.BY_NAME[name].agent}"
        if done.returncode == 0
        else (done.stderr or done.stdout).strip()[-300:],
        time.monotonic() - start,
    )


def check_gfd(fs: Rootfs) -> Check:
    start = time.monotonic()
    done = fs.run(
        [
            "gpu-feature-discovery",
            "--oneshot",
            "--output-file=-",
            "--no-timestamp",
            "--backend=mock",
            f"--machine={MACHINE}",
        ],
        user=AGENT_USER,
        env={"MIG_STRATEGY": "single"},
        timeout=120,
    )
    labels = dict(
        line.split("=", 1) for line in done.stdout.splitlines() if line.startswith("nvidia.com/")
    )
    ok = done.returncode == 0 and labels.get("nvidia.com/gpu.count") == "8"
    return Check(
        "gpu-feature-discovery --oneshot (mock)",
        ok,
        f"{len(labels)} labels, gpu.product={labels.get('nvidia.com/gpu.product')}, "
        f"gpu.count={labels.get('nvidia.com/gpu.count')}"
        if ok
        else (done.stderr or done.stdout).strip()[-400:],
        time.monotonic() - start,
    )


@contextlib.contextmanager
def _started(fs: Rootfs, argv: Sequence[str], **kwargs: Any) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        fs.command(argv, **kwargs), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            # unshare --fork ignores SIGTERM while it waits: signal the program itself (PID 1 of
            # its namespace, which takes the signals it has handlers for, as in a container).
            for pid in _children(proc.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            found += [int(c) for c in (task / "children").read_text().split()]
    return found


def _output(proc: subprocess.Popen[str]) -> str:
    if proc.poll() is None:
        return ""
    return (proc.stdout.read() if proc.stdout else "")[-600:]


def check_device_plugin(fs: Rootfs) -> Check:
    """The plugin registers with a kubelet stand-in (served here, on a socket shared into the
    rootfs) and lists the mock machine's 8 GPUs over its own socket."""
    import grpc

    from kubeletapi.deviceplugin.v1beta1 import api_pb2 as pb
    from kubeletapi.deviceplugin.v1beta1 import api_pb2_grpc as pb_grpc

    start = time.monotonic()
    shared = Path(tempfile.mkdtemp(prefix="dp-", dir="/tmp"))
    registered: list[Any] = []

    class Kubelet(pb_grpc.RegistrationServicer):  # type: ignore[misc]
        async def Register(self, request: Any, context: Any) -> Any:
            registered.append(request)
            return pb.Empty()

    async def main() -> tuple[bool, str]:
        server = grpc.aio.server()
        pb_grpc.add_RegistrationServicer_to_server(Kubelet(), server)
        server.add_insecure_port(f"unix://{shared}/kubelet.sock")
        await server.start()
        argv = ["nvidia-device-plugin", "--backend=mock", f"--machine={MACHINE}"]
        env = {
            "KUBELET_SOCKET": f"{SHARED}/kubelet.sock",
            "DEVICE_PLUGIN_PATH": SHARED,
            "FAIL_ON_INIT_ERROR": "true",
            "PASS_DEVICE_SPECS": "false",
        }
        try:
            with _started(fs, argv, user=AGENT_USER, env=env, shared=shared) as proc:
                deadline = time.monotonic() + 90
                while not registered and time.monotonic() < deadline and proc.poll() is None:
                    await asyncio.sleep(0.1)
                if not registered:
                    return False, f"no registration: {_output(proc)}"
                request = registered[0]
                channel = grpc.aio.insecure_channel(f"unix://{shared}/{request.endpoint}")
                stub = pb_grpc.DevicePluginStub(channel)
                stream = stub.ListAndWatch(pb.Empty())
                first = await asyncio.wait_for(stream.read(), 30)
                stream.cancel()
                await channel.close()
                devices = list(first.devices)
                healthy = sum(d.health == "Healthy" for d in devices)
                ok = request.resource_name == "nvidia.com/gpu" and len(devices) == 8
                return ok, (
                    f"registered {request.resource_name} ({request.endpoint}), "
                    f"ListAndWatch: {len(devices)} devices, {healthy} healthy"
                )
        finally:
            await server.stop(0)

    try:
        ok, detail = asyncio.run(main())
    finally:
        shutil.rmtree(shared, ignore_errors=True)
    return Check("nvidia-device-plugin (mock)", ok, detail, time.monotonic() - start)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def check_exporter(fs: Rootfs) -> Check:
    start = time.monotonic()
    port = _free_port()
    argv = ["dcgm-exporter", "--backend", "mock", "--machine", MACHINE]
    env = {"DCGM_EXPORTER_LISTEN": f"127.0.0.1:{port}", "NODE_NAME": "smoke"}
    with _started(fs, argv, user=AGENT_USER, env=env) as proc:
        deadline = time.monotonic() + 90
        body = ""
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                    body = r.read().decode()
                break
            except OSError:
                time.sleep(0.2)
        util = [line for line in body.splitlines() if line.startswith("DCGM_FI_DEV_GPU_UTIL{")]
        ok = len(util) == 8
        detail = (
            f"/metrics: {len(body.splitlines())} lines, DCGM_FI_DEV_GPU_UTIL for {len(util)} GPUs"
            if body
            else f"no /metrics: {_output(proc)}"
        )
    return Check("dcgm-exporter (mock) /metrics", ok, detail, time.monotonic() - start)


def smoke(fs: Rootfs) -> list[Check]:
    checks = [check_version(fs)]
    checks += [check_help(fs, name) for name in entrypoints.NAMES]
    checks += [check_gfd(fs), check_device_plugin(fs), check_exporter(fs)]
    return checks


def export(image: str, dest: Path) -> Rootfs:
    """Unpack `image` (podman) into `dest`, with its config next to it."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    ctr = subprocess.run(
        ["podman", "create", image], capture_output=True, text=True, check=True
    ).stdout.strip()
    try:
        with subprocess.Popen(["podman", "export", ctr], stdout=subprocess.PIPE) as exported:
            subprocess.run(["tar", "-C", str(dest), "-xf", "-"], stdin=exported.stdout, check=True)
    finally:
        subprocess.run(["podman", "rm", "-f", ctr], capture_output=True, check=False)
    config = subprocess.run(
        ["podman", "image", "inspect", "--format", "{{json .Config}}", image],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    dest.with_name(dest.name + ".config.json").write_text(config)
    return Rootfs.open(dest)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("rootfs", type=Path, help="the unpacked image (build-image --export DIR)")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("image_smoke: needs root (unshare, chroot)", file=sys.stderr)
        return 2
    fs = Rootfs.open(args.rootfs)
    failed = 0
    for check in smoke(fs):
        failed += not check.ok
        verdict = "PASS" if check.ok else "FAIL"
        print(f"{verdict}  {check.name:48} {check.seconds:5.2f}s  {check.detail}")
    print(f"{'all passed' if not failed else f'{failed} failed'}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
