"""The simulated container runtime of each demo node (demo.containerd): how containerd and CRI-O
read their configuration, what they serve, what the NVIDIA runtime injects, and how each failure
shows through the real kubectl on the demo cluster."""

from __future__ import annotations

import json
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_gpu_journey import CUDA, KUBECTL, Served, served
from waiting import DEADLINE, eventually

import kubesim
from gpudemo import fleet
from simhost import containerd, runtime_boot
from simhost import runtime_config as rc

TOOLKIT = "/usr/local/nvidia/toolkit"
NVIDIA_BINARY = f"{TOOLKIT}/nvidia-container-runtime"
V3_CRI = "plugins.'io.containerd.cri.v1.runtime'"
needs_kubectl = pytest.mark.skipif(not KUBECTL.exists(), reason="kubectl not installed")


def put(root: Path, node_path: str, text: str) -> Path:
    path = root / node_path.lstrip("/")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def executable(root: Path, node_path: str) -> None:
    put(root, node_path, "#!/bin/sh\n").chmod(0o755)


def nvidia_drop_in(version: int = 3, binary: str = NVIDIA_BINARY, **extra: str) -> str:
    plugin = rc.CRI_PLUGIN[version]
    lines = [f"version = {version}", ""]
    for key, value in extra.items():
        lines += [f"[plugins.'{plugin}']", f"  {key} = {value}", ""]
    lines += [
        f"[plugins.'{plugin}'.containerd.runtimes.nvidia]",
        "  runtime_type = 'io.containerd.runc.v2'",
        f"  [plugins.'{plugin}'.containerd.runtimes.nvidia.options]",
        f"    BinaryName = '{binary}'",
    ]
    return "\n".join(lines) + "\n"


def with_imports(original: str, *imports: str) -> str:
    first, rest = original.split("\n", 1)
    return f"{first}\nimports = {json.dumps(list(imports))}\n{rest}"


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A folder whose socket paths fit AF_UNIX's 108 bytes (pytest's tmp_path under xdist, with
    a long test name and a three-digit run number, does not)."""
    with tempfile.TemporaryDirectory(prefix="ctd-") as folder:
        yield Path(folder)


def booted(tmp_path: Path, runtime: str = "containerd", version: str = "2.0.5") -> Path:
    root = tmp_path / "node"
    runtime_boot.write(root, runtime, version)
    return root


def view(
    env: dict[str, str] | None = None,
    *,
    handler: str = "",
    cdi: tuple[str, ...] = (),
    name: str = "work",
    uid: str = "uid-1",
) -> kubesim.ContainerView:
    pod = {"metadata": {"name": "p", "namespace": "default", "uid": uid}, "spec": {}}
    return kubesim.ContainerView(
        pod=pod,
        container={"name": name},
        node_name="node",
        env=env or {},
        runtime_handler=handler,
        cdi_devices=cdi,
    )


def sandbox(handler: str) -> kubesim.PodSandbox:
    return kubesim.PodSandbox("f" * 64, "node", {"metadata": {}}, handler)


DEVICES = {
    "0": "GPU-aaaa",
    "GPU-aaaa": "GPU-aaaa",
    "1": "GPU-bbbb",
    "GPU-bbbb": "GPU-bbbb",
}


def management_spec(root: Path, names: tuple[str, ...] = ("0", "1", "GPU-aaaa", "all")) -> None:
    spec = {
        "cdiVersion": "0.5.0",
        "kind": "management.nvidia.com/gpu",
        "devices": [
            {"name": n, "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}]}}
            for n in names
        ],
        "containerEdits": {
            "mounts": [
                {"hostPath": "/run/nvidia/driver/usr/bin/nvidia-smi", "containerPath": p}
                for p in ("/usr/bin/nvidia-smi", "/usr/lib/x86_64-linux-gnu/libcuda.so.1")
            ]
        },
    }
    put(root, "/var/run/cdi/management.nvidia.com-gpu.yaml", yaml.safe_dump(spec))


# ----- the original configuration each node boots with ------------------------------------------


@pytest.mark.parametrize(
    ("runtime", "version", "owned"),
    [
        (
            "containerd",
            "2.0.5",
            ["config_path = '/etc/containerd/certs.d'", "SystemdCgroup = true",
             "bin_dir = '/opt/cni/bin'", "conf_dir = '/etc/cni/net.d'",
             "sandbox = 'registry.k8s.io/pause:3.10'", "version = 3"],
        ),
        (
            "containerd",
            "1.7.27",
            ['config_path = "/etc/containerd/certs.d"', "SystemdCgroup = true",
             'bin_dir = "/opt/cni/bin"', 'sandbox_image = "registry.k8s.io/pause:3.10"',
             "version = 2"],
        ),
        ("cri-o", "1.32.1", ['network_dir = "/etc/cni/net.d/"', 'pause_image = "registry']),
        ("docker", "27.3.1", ['"native.cgroupdriver=systemd"', '"registry-mirrors"']),
    ],
)  # fmt: skip
def test_each_node_boots_with_the_runtime_config_its_image_brings(
    tmp_path: Path, runtime: str, version: str, owned: list[str]
) -> None:
    root = tmp_path / "node"
    written = runtime_boot.write(root, runtime, version)
    assert written == runtime_boot.ORIGINALS[runtime_boot.layout(runtime, version)]
    for node_path, text in written.items():
        assert (root / node_path.lstrip("/")).read_bytes() == text.encode()
    everything = "".join(written.values())
    for section in owned:
        assert section in everything
    assert (root / "opt/cni/bin/bridge").stat().st_mode & 0o111


def test_fleet_pools_choose_the_runtime_version_and_nodes_report_it() -> None:
    parsed = fleet.parse(
        {"pools": [{"name": "old", "runtimeVersion": "1.7.27"}, {"name": "new"}]}, "f.yaml"
    )
    infos = [plan.node_info["containerRuntimeVersion"] for plan in fleet.plan_nodes(parsed)]
    assert infos == ["containerd://1.7.27", "containerd://2.0.5"]
    with pytest.raises(fleet.FleetError, match=r"pools\.0\.runtimeVersion"):
        fleet.parse({"pools": [{"name": "x", "runtimeVersion": "latest"}]}, "f.yaml")


# ----- containerd's configuration rules -----------------------------------------------------------


def test_containerd_2_serves_runc_with_cdi_on_and_1_7_with_cdi_off(tmp_path: Path) -> None:
    new = rc.load_containerd(booted(tmp_path / "a"), "2.0.5")
    old = rc.load_containerd(booted(tmp_path / "b", version="1.7.27"), "1.7.27")
    assert (new.version, new.default_runtime, dict(new.runtimes)) == (
        3,
        "runc",
        {"runc": rc.Runtime("runc", rc.RUNC_TYPE)},
    )
    assert new.enable_cdi is True
    assert old.version == 2
    assert old.enable_cdi is False
    assert new.cdi_spec_dirs == ("/etc/cdi", "/var/run/cdi")


def test_containerd_2_merges_globbed_relative_imports_into_the_plugin_table(
    tmp_path: Path,
) -> None:
    root = booted(tmp_path)
    config = root / "etc/containerd/config.toml"
    config.write_text(with_imports(runtime_boot.CONTAINERD_V3, "conf.d/*.toml"))
    put(root, "/etc/containerd/conf.d/99-nvidia.toml", nvidia_drop_in(enable_cdi="false"))
    put(root, "/etc/containerd/conf.d/10-other.toml", "version = 3\n")
    loaded = rc.load_containerd(root, "2.0.5")
    assert loaded.files == (
        "/etc/containerd/config.toml",
        "/etc/containerd/conf.d/10-other.toml",
        "/etc/containerd/conf.d/99-nvidia.toml",
    )
    assert sorted(loaded.runtimes) == ["nvidia", "runc"]  # runc survives the import
    assert loaded.runtimes["nvidia"].binary == NVIDIA_BINARY
    assert loaded.enable_cdi is False  # the later file wins


def test_containerd_1_7_lets_an_import_replace_the_whole_cri_table(tmp_path: Path) -> None:
    root = booted(tmp_path, version="1.7.27")
    config = root / "etc/containerd/config.toml"
    config.write_text(with_imports(runtime_boot.CONTAINERD_V2, "/etc/containerd/conf.d/*.toml"))
    put(
        root,
        "/etc/containerd/conf.d/99-nvidia.toml",
        nvidia_drop_in(2).replace("version = 2\n", "version = 2\n")
        + "[plugins.'io.containerd.grpc.v1.cri'.containerd]\n  default_runtime_name = 'runc'\n",
    )
    with pytest.raises(rc.ConfigError) as err:
        rc.load_containerd(root, "1.7.27")
    assert err.value.message == (
        "failed to load plugin io.containerd.grpc.v1.cri: invalid plugin config: no "
        "corresponding runtime configured in `containerd.runtimes` for `containerd` "
        '`default_runtime_name = "runc"`'
    )
    # The same files on containerd 2.x keep runc.
    root2 = booted(tmp_path / "two")
    (root2 / "etc/containerd/config.toml").write_text(
        with_imports(runtime_boot.CONTAINERD_V3, "/etc/containerd/conf.d/*.toml")
    )
    put(root2, "/etc/containerd/conf.d/99-nvidia.toml", nvidia_drop_in(3))
    assert sorted(rc.load_containerd(root2, "2.0.5").runtimes) == ["nvidia", "runc"]


def test_containerd_1_7_ignores_a_version_3_file_and_reads_version_1(tmp_path: Path) -> None:
    root = tmp_path / "node"
    put(root, rc.CONTAINERD_CONFIG, nvidia_drop_in(3))
    assert list(rc.load_containerd(root, "1.7.27").runtimes) == ["runc"]
    assert sorted(rc.load_containerd(root, "2.0.5").runtimes) == ["nvidia", "runc"]
    v1 = (
        "[plugins.cri.containerd]\n  default_runtime_name = 'nvidia'\n"
        "[plugins.cri.containerd.runtimes.nvidia]\n  runtime_type = 'io.containerd.runc.v2'\n"
        "[plugins.cri.containerd.runtimes.nvidia.options]\n  BinaryName = '/x/nvidia'\n"
    )
    put(root, rc.CONTAINERD_CONFIG, v1)
    for version in ("1.7.27", "2.0.5"):
        assert rc.load_containerd(root, version).runtimes["nvidia"].binary == "/x/nvidia"


def test_a_missing_import_is_fatal_on_1_7_and_skipped_on_2(tmp_path: Path) -> None:
    root = tmp_path / "node"
    put(root, rc.CONTAINERD_CONFIG, 'version = 2\nimports = ["/etc/containerd/gone.toml"]\n')
    with pytest.raises(rc.ConfigError, match=r"open /etc/containerd/gone\.toml: no such file"):
        rc.load_containerd(root, "1.7.27")
    loaded = rc.load_containerd(root, "2.0.5")
    assert loaded.warnings == ("open /etc/containerd/gone.toml: no such file or directory",)


def test_a_config_that_does_not_parse_names_row_and_column(tmp_path: Path) -> None:
    root = tmp_path / "node"
    put(root, rc.CONTAINERD_CONFIG, "version = 3\n[plugins\n")
    with pytest.raises(rc.ConfigError, match=r"^failed to unmarshal TOML at row 2 column \d+: "):
        rc.load_containerd(root, "2.0.5")
    with pytest.raises(rc.ConfigError, match=r"^failed to load TOML: /etc/containerd/config"):
        rc.load_containerd(root, "1.7.27")


# ----- CRI-O --------------------------------------------------------------------------------------


def test_crio_reads_drop_ins_in_lexical_order_and_drops_handlers_without_binary(
    tmp_path: Path,
) -> None:
    root = booted(tmp_path, "cri-o", "1.32.1")
    put(
        root,
        "/etc/crio/crio.conf.d/99-nvidia.conf",
        f'[crio.runtime.runtimes.nvidia]\nruntime_path = "{NVIDIA_BINARY}"\n'
        f'[crio.runtime.runtimes.ghost]\nruntime_path = "/nowhere/ghost"\n',
    )
    put(root, "/etc/crio/crio.conf.d/50-default.conf", '[crio.runtime]\ndefault_runtime = "runc"\n')
    executable(root, NVIDIA_BINARY)
    loaded = rc.load_crio(root)
    assert loaded.files[-2:] == (
        "/etc/crio/crio.conf.d/50-default.conf",
        "/etc/crio/crio.conf.d/99-nvidia.conf",
    )
    assert loaded.default_runtime == "runc"
    assert sorted(loaded.runtimes) == ["crun", "nvidia", "runc"]
    assert loaded.enable_cdi is True
    assert loaded.warnings == (
        'Runtime handler "ghost" is being ignored due to: invalid runtime_path for runtime '
        "'ghost': \"stat /nowhere/ghost: no such file or directory\"",
    )
    put(root, "/etc/crio/crio.conf.d/60-broken.conf", '[crio.runtime]\ndefault_runtime = "ghost"\n')
    with pytest.raises(rc.ConfigError, match=r"^validating runtime config: runtime validation"):
        rc.load_crio(root)


def test_crio_refuses_an_unknown_handler_with_its_runtime_list(tmp_path: Path) -> None:
    runtime = containerd.SimulatedCrio("node", booted(tmp_path, "cri-o", "1.32.1"))
    assert runtime.start()
    with pytest.raises(kubesim.CriError) as err:
        runtime.run_sandbox(sandbox("nvidia"))
    assert err.value.message.startswith(
        "failed to find runtime handler nvidia from runtime list map[crun:0xc"
    )
    assert " runc:0xc" in err.value.message


# ----- the runtime process: start, restart, signals -----------------------------------------------


def test_sighup_restarts_containerd_with_the_handlers_now_configured(short_tmp: Path) -> None:
    root = booted(short_tmp)
    runtime = containerd.SimulatedContainerd("node", root)
    assert runtime.start()
    assert runtime.handlers() == {"runc": ""}
    assert runtime.socket_path == root / "run/containerd/containerd.sock"
    assert runtime.socket_path.is_socket()
    (root / "etc/containerd/config.toml").write_text(
        with_imports(runtime_boot.CONTAINERD_V3, "/etc/containerd/conf.d/*.toml")
    )
    put(root, "/etc/containerd/conf.d/99-nvidia.toml", nvidia_drop_in())
    assert runtime.handlers() == {"runc": ""}  # nothing changes before the restart
    runtime.signal(signal.SIGUSR1)
    assert "nvidia" not in runtime.handlers()
    runtime.signal(signal.SIGHUP)
    assert runtime.handlers() == {"runc": "", "nvidia": NVIDIA_BINARY}
    assert runtime.restarts == 1
    assert any("received signal SIGHUP" in line for line in runtime.journal)
    assert "handlers=[nvidia=" in (root / "var/log/containerd.log").read_text()


def test_a_broken_config_takes_the_runtime_down_until_fixed_and_restarted(
    tmp_path: Path,
) -> None:
    root = booted(tmp_path)
    states: list[tuple[bool, str]] = []
    runtime = containerd.SimulatedContainerd("node", root, on_state=lambda *s: states.append(s))
    assert runtime.start()
    config = root / "etc/containerd/config.toml"
    config.write_text("version = 3\n[plugins\n")
    assert not runtime.restart()
    assert runtime.up is False
    assert not runtime.socket_path.exists()
    assert runtime.error is not None
    assert runtime.error.startswith("failed to unmarshal TOML at row 2")
    assert states == [(True, ""), (False, runtime.error)]
    with pytest.raises(kubesim.CriError) as err:
        runtime.run_sandbox(sandbox(""))
    assert err.value.code == "Unavailable"
    config.write_text(runtime_boot.CONTAINERD_V3)
    assert runtime.restart()
    assert states[-1] == (True, "")


# ----- sandboxes and containers -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        ("2.0.5", f'unable to get OCI runtime for sandbox "{"f" * 64}": no runtime for "nvidia" '
                  "is configured"),
        ("1.7.27", 'failed to get sandbox runtime: no runtime for "nvidia" is configured'),
    ],
)  # fmt: skip
def test_an_unconfigured_handler_fails_the_sandbox_as_containerd_does(
    tmp_path: Path, version: str, expected: str
) -> None:
    runtime = containerd.SimulatedContainerd(
        "node", booted(tmp_path, version=version), version=version
    )
    assert runtime.start()
    runtime.run_sandbox(sandbox(""))  # the default handler, runc
    with pytest.raises(kubesim.CriError) as err:
        runtime.run_sandbox(sandbox("nvidia"))
    assert err.value.message == expected


def test_a_handler_whose_binary_is_gone_fails_as_the_shim_cannot_exec_it(tmp_path: Path) -> None:
    root = booted(tmp_path)
    put(root, rc.CONTAINERD_CONFIG, nvidia_drop_in())
    runtime = containerd.SimulatedContainerd("node", root)
    assert runtime.start()
    with pytest.raises(kubesim.CriError) as err:
        runtime.run_sandbox(sandbox("nvidia"))
    assert err.value.message == (
        "failed to create containerd task: failed to create shim task: OCI runtime create "
        "failed: unable to retrieve OCI runtime error (open /run/containerd/io.containerd."
        f"runtime.v2.task/k8s.io/{'f' * 64}/log.json: no such file or directory): fork/exec "
        f"{NVIDIA_BINARY}: no such file or directory: unknown"
    )
    executable(root, NVIDIA_BINARY)
    runtime.run_sandbox(sandbox("nvidia"))
    (root / NVIDIA_BINARY.lstrip("/")).unlink()
    with pytest.raises(kubesim.StartContainerError, match="fork/exec"):
        runtime.create_container(view(handler="nvidia"))


def test_cdi_devices_resolve_from_the_spec_dirs_only_when_enable_cdi_is_on(
    tmp_path: Path,
) -> None:
    root = booted(tmp_path)
    runtime = containerd.SimulatedContainerd("node", root, devices=lambda: DEVICES)
    assert runtime.start()
    names = ("management.nvidia.com/gpu=0",)
    with pytest.raises(kubesim.CriError) as err:
        runtime.create_container(view(cdi=names))
    assert err.value.message == (
        "failed to create containerd container: CDI device injection failed: unresolvable CDI "
        "devices management.nvidia.com/gpu=0"
    )
    management_spec(root)
    runtime.create_container(view(cdi=names))
    injection = runtime.injected(view())
    assert injection is not None
    assert injection.mode == "cdi"
    assert injection.gpu_ids == ("0",)
    assert injection.uuids == ("GPU-aaaa",)
    assert injection.nvidia_smi
    assert injection.libraries == ("/usr/lib/x86_64-linux-gnu/libcuda.so.1",)
    # containerd 1.7 with enable_cdi off ignores the names: the container gets nothing.
    old = containerd.SimulatedContainerd(
        "node", booted(tmp_path / "old", version="1.7.27"), version="1.7.27"
    )
    assert old.start()
    old.create_container(view(cdi=names))
    assert old.injected(view()) is None


def test_the_nvidia_runtime_in_cdi_mode_needs_the_management_spec(tmp_path: Path) -> None:
    root = booted(tmp_path)
    put(root, rc.CONTAINERD_CONFIG, nvidia_drop_in())
    executable(root, NVIDIA_BINARY)
    put(
        root,
        rc.nvidia_runtime_config_path(NVIDIA_BINARY),
        '[nvidia-container-runtime]\nmode = "cdi"\n[nvidia-container-runtime.modes.cdi]\n'
        'default-kind = "management.nvidia.com/gpu"\n',
    )
    runtime = containerd.SimulatedContainerd("node", root, devices=lambda: DEVICES)
    assert runtime.start()
    gpu_view = view({"NVIDIA_VISIBLE_DEVICES": "all"}, handler="nvidia")
    with pytest.raises(kubesim.StartContainerError) as err:
        runtime.create_container(gpu_view)
    assert err.value.message == (
        "failed to create containerd task: failed to create shim task: OCI runtime create "
        "failed: could not apply required modification to OCI specification: error modifying "
        "OCI spec: failed to inject CDI devices: unresolvable CDI devices "
        "management.nvidia.com/gpu=all: unknown"
    )
    management_spec(root)
    runtime.create_container(gpu_view)
    injection = runtime.injected(gpu_view)
    assert injection is not None
    assert (injection.mode, injection.all_gpus) == ("nvidia-cdi", True)
    assert injection.uuids == ("GPU-aaaa", "GPU-bbbb")
    # Under runc the same variable is only an environment variable.
    runtime.create_container(view({"NVIDIA_VISIBLE_DEVICES": "all"}, name="plain"))
    assert runtime.injected(view(name="plain")) is None


def test_the_legacy_runtime_needs_the_driver_and_mounts_its_files(tmp_path: Path) -> None:
    root = booted(tmp_path)
    legacy = f"{NVIDIA_BINARY}.legacy"
    put(root, rc.CONTAINERD_CONFIG, nvidia_drop_in(binary=legacy))
    executable(root, legacy)
    put(root, rc.nvidia_runtime_config_path(legacy), '[nvidia-container-cli]\nroot = "/drv"\n')
    runtime = containerd.SimulatedContainerd("node", root, devices=lambda: DEVICES)
    assert runtime.start()
    gpu_view = view({"NVIDIA_VISIBLE_DEVICES": "1"}, handler="nvidia")
    with pytest.raises(kubesim.StartContainerError) as err:
        runtime.create_container(gpu_view)
    assert err.value.message.endswith(
        "error running hook #0: error running hook: exit status 1, stdout: , stderr: "
        "nvidia-container-cli: initialization error: nvml error: driver not loaded: unknown"
    )
    put(root, containerd.DRIVER_VERSION_FILE, "NVRM version: NVIDIA UNIX x86_64 Kernel Module\n")
    executable(root, "/drv/usr/bin/nvidia-smi")
    put(root, "/drv/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.95.05", "")
    put(root, "/drv/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05", "")
    runtime.create_container(gpu_view)
    injection = runtime.injected(gpu_view)
    assert injection is not None
    assert (injection.mode, injection.gpu_ids, injection.uuids) == ("legacy", ("1",), ("GPU-bbbb",))
    assert injection.mounts == (
        "/usr/bin/nvidia-smi",
        "/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05",
        "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.95.05",
    )
    with pytest.raises(kubesim.StartContainerError, match="device error: 7: unknown device"):
        runtime.create_container(view({"NVIDIA_VISIBLE_DEVICES": "7"}, handler="nvidia"))
    # Without the utility capability there is no nvidia-smi.
    compute = view({"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_DRIVER_CAPABILITIES": "compute"},
                   handler="nvidia", name="compute")  # fmt: skip
    runtime.create_container(compute)
    assert runtime.injected(compute) is not None
    assert not runtime.injected(compute).nvidia_smi  # type: ignore[union-attr]


# ----- on the demo cluster, through kubectl -------------------------------------------------------


def gpu_pod(name: str, node: str, *, handler: str | None = None, **extra: Any) -> str:
    container: dict[str, Any] = {
        "name": "main",
        "image": CUDA,
        "command": ["nvidia-smi", "-L"],
        **extra,
    }
    spec: dict[str, Any] = {"nodeName": node, "restartPolicy": "Never", "containers": [container]}
    if handler is not None:
        spec["runtimeClassName"] = handler
    return json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec})


async def create(demo: Served, tmp_path: Path, body: str) -> None:
    path = tmp_path / f"pod-{json.loads(body)['metadata']['name']}.json"
    path.write_text(body)
    await demo.kubectl("create", "-f", str(path))


def one_gpu() -> dict[str, Any]:
    return {"resources": {"limits": {"nvidia.com/gpu": "1"}}}


async def waiting_reason(demo: Served, name: str, reason: str) -> str:
    def reached() -> bool:
        statuses = (demo.pod(name).get("status") or {}).get("containerStatuses") or [{}]
        return ((statuses[0].get("state") or {}).get("waiting") or {}).get("reason") == reason

    await eventually(
        reached,
        f"{name} waiting in {reason}",
        state=lambda: (demo.pod(name).get("status") or {}).get("containerStatuses"),
    )
    _, described = await demo.kubectl("describe", "pod", name)
    return described


@needs_kubectl
@pytest.mark.parametrize(
    ("pools", "versions"),
    [
        (
            [
                {"name": "new", "machine": "t4x4"},
                {"name": "old", "machine": "t4x4", "runtimeVersion": "1.7.27"},
            ],
            {"new-1": "containerd://2.0.5", "old-1": "containerd://1.7.27"},
        ),
        # The operator configures one runtime kind per cluster, as upstream does.
        ([{"name": "crio", "machine": "t4x4", "runtime": "cri-o"}], {"crio-1": "cri-o://1.32.1"}),
    ],
    ids=["containerd-2-and-1.7", "cri-o"],
)
async def test_gpu_pods_get_their_gpu_through_each_runtime(
    tmp_path: Path, pools: list[dict[str, Any]], versions: dict[str, str]
) -> None:
    async with served(pools, tmp_path) as demo:
        for node, version in versions.items():
            _, reported = await demo.kubectl(
                "get", "node", node, "-o", "jsonpath={.status.nodeInfo.containerRuntimeVersion}"
            )
            assert reported == version
            runtime = demo.nodes.runtime(node)
            assert runtime is not None
            assert runtime.handlers()["nvidia"] == NVIDIA_BINARY
            assert runtime.enable_cdi
            name = f"smi-{node}"
            await create(demo, tmp_path, gpu_pod(name, node, **one_gpu()))
            assert await demo.phase(name, "Succeeded", "Failed") == "Succeeded"
            _, listed = await demo.kubectl("logs", name)
            assert listed.startswith("GPU 0: Tesla T4"), listed
            injection = demo.nodes.injected(
                kubesim.ContainerView(demo.pod(name), {"name": "main"}, node, {})
            )
            assert injection is not None
            # The device plugin's CDI devices, resolved by the CRI runtime itself.
            assert injection.mode == "cdi"
            assert injection.cdi_devices[0].startswith("k8s.device-plugin.nvidia.com/gpu=GPU-")


@needs_kubectl
async def test_each_runtime_failure_shows_in_kubectl(tmp_path: Path) -> None:
    async with served([{"name": "t4", "machine": "t4x4"}], tmp_path) as demo:
        node = "t4-1"
        runtime = demo.nodes.runtime(node)
        assert isinstance(runtime, containerd.SimulatedContainerd)
        root = demo.sim.node_root(node)

        # The legacy handler mounts the driver's files from /run/nvidia/driver.
        env = {"env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}
        await create(demo, tmp_path, gpu_pod("legacy", node, handler="nvidia-legacy", **env))
        assert await demo.phase("legacy", "Succeeded", "Failed") == "Succeeded"
        _, listed = await demo.kubectl("logs", "legacy")
        assert len(listed.splitlines()) == 4, listed

        # A GPU pod whose CDI device has no spec any more.
        spec = root / "var/run/cdi/k8s.device-plugin.nvidia.com-gpu.json"
        saved = spec.read_bytes()
        spec.unlink()
        await create(demo, tmp_path, gpu_pod("no-spec", node, **one_gpu()))
        described = await waiting_reason(demo, "no-spec", "CreateContainerError")
        assert "CDI device injection failed: unresolvable CDI devices" in described
        assert "k8s.device-plugin.nvidia.com/gpu=GPU-" in described
        spec.write_bytes(saved)
        assert await demo.phase("no-spec", "Succeeded", "Failed") == "Succeeded"

        # The toolkit turned off: it restores the original config and restarts containerd, so
        # the nvidia handler is gone for new pods.
        await demo.kubectl(
            "patch", "clusterpolicy", "cluster-policy", "--type=merge",
            "-p", '{"spec": {"toolkit": {"enabled": false}}}',
        )  # fmt: skip
        await demo.sim.wait_for(
            lambda: "nvidia" not in runtime.handlers(), DEADLINE, "the toolkit's handlers gone"
        )
        await create(demo, tmp_path, gpu_pod("no-handler", node, handler="nvidia"))
        await demo.sim.wait_for(
            lambda: sandbox_failures(demo, "no-handler"), DEADLINE, "FailedCreatePodSandBox"
        )
        _, described = await demo.kubectl("describe", "pod", "no-handler")
        assert "FailedCreatePodSandBox" in described
        assert 'no runtime for "nvidia" is configured' in described
        assert "ContainerCreating" in (await demo.kubectl("get", "pod", "no-handler"))[1]

        # A config left naming the toolkit's runtime after its binary is gone.
        config = root / "etc/containerd/config.toml"
        config.write_text(with_imports(runtime_boot.CONTAINERD_V3, "conf.d/*.toml"))
        put(root, "/etc/containerd/conf.d/99-nvidia.toml", nvidia_drop_in())
        (root / NVIDIA_BINARY.lstrip("/")).unlink(missing_ok=True)
        runtime.signal(signal.SIGHUP)
        await create(demo, tmp_path, gpu_pod("no-binary", node, handler="nvidia"))
        await demo.sim.wait_for(
            lambda: sandbox_failures(demo, "no-binary"), DEADLINE, "FailedCreatePodSandBox"
        )
        _, described = await demo.kubectl("describe", "pod", "no-binary")
        assert f"fork/exec {NVIDIA_BINARY}: no such file or directory" in described

        # A config that does not parse: containerd does not come back, the node is NotReady.
        config.write_text("version = 3\n[plugins\n")
        runtime.restart()
        await demo.sim.wait_for(lambda: not _ready(demo, node), DEADLINE, "node NotReady")
        _, nodes = await demo.kubectl("get", "node", node)
        assert "NotReady" in nodes
        _, described = await demo.kubectl("describe", "node", node)
        assert "container runtime is down" in described
        config.write_text(runtime_boot.CONTAINERD_V3)
        runtime.restart()
        await demo.sim.wait_for(lambda: _ready(demo, node), DEADLINE, "node Ready again")


def sandbox_failures(demo: Served, pod: str) -> bool:
    return any(
        e.get("reason") == "FailedCreatePodSandBox"
        and (e.get("involvedObject") or {}).get("name") == pod
        for e in demo.sim.store.list("events", "default")
    )


def _ready(demo: Served, node: str) -> bool:
    for condition in (demo.node(node).get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            return bool(condition.get("status") == "True")
    return False


def test_the_image_environment_counts_a_cuda_image_asks_for_every_gpu(tmp_path: Path) -> None:
    root = booted(tmp_path)
    legacy = f"{NVIDIA_BINARY}.legacy"
    put(root, rc.CONTAINERD_CONFIG, nvidia_drop_in(binary=legacy))
    executable(root, legacy)
    put(root, containerd.DRIVER_VERSION_FILE, "NVRM version: NVIDIA UNIX x86_64 Kernel Module\n")
    runtime = containerd.SimulatedContainerd("node", root, devices=lambda: DEVICES)
    assert runtime.start()
    cuda = view(handler="nvidia")
    cuda.container["image"] = CUDA
    runtime.create_container(cuda)
    injection = runtime.injected(cuda)
    assert injection is not None
    assert injection.all_gpus  # no GPU requested, yet every GPU: the image's ENV
    # The pod's own variable wins over the image's.
    void = view({"NVIDIA_VISIBLE_DEVICES": "void"}, handler="nvidia", name="void")
    void.container["image"] = CUDA
    runtime.create_container(void)
    assert runtime.injected(void) is None
    assert containerd.image_env("busybox:1.36") == {}
