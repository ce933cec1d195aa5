"""The kubelet: pods that finish, restarts with back-off, kubelet and node Events, node host
filesystems and every pod volume type as real files for pod runners."""

from __future__ import annotations

import asyncio
import base64
import itertools
import os
import socket
import stat
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kubesim_helpers import TEST_IMAGES, instant
from waiting import DEADLINE, eventually

import kubesim
from kubesim import KubeletConfig, PodContext
from kubesim.controllers.volumes import PathNotMounted

FAST = KubeletConfig(
    init_container_duration=0.01,
    start_delay=0.01,
    ready_delay=0.01,
    restart_delay=0.05,
    restart_delay_max=0.2,
    command_duration=0.05,
    mount_retry_delay=0.05,
    lease_interval=None,
)


@pytest.fixture
async def sim() -> AsyncIterator[kubesim.Cluster]:
    async with kubesim.Cluster(images=TEST_IMAGES, nodes=2, kubelet=FAST) as cluster:
        yield cluster


def pod(
    name: str, *containers: dict[str, Any], node: str = "node-1", **spec: Any
) -> dict[str, Any]:
    """A Pod bound to `node` (default one `main` container)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": node,
            "containers": list(containers) or [{"name": "main", "image": "example/app:1"}],
            **spec,
        },
    }


def get(sim: kubesim.Cluster, name: str) -> dict[str, Any]:
    found = sim.store.get("pods", name, "default")
    assert found is not None, name
    return found


def phase(sim: kubesim.Cluster, name: str) -> str:
    return str((get(sim, name).get("status") or {}).get("phase"))


def container_status(sim: kubesim.Cluster, name: str, index: int = 0) -> dict[str, Any]:
    return dict((get(sim, name).get("status") or {}).get("containerStatuses", [{}])[index])


def condition(sim: kubesim.Cluster, name: str, ctype: str) -> dict[str, Any]:
    conditions = (get(sim, name).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == ctype), {})


def events(sim: kubesim.Cluster, name: str, reason: str | None = None) -> list[dict[str, Any]]:
    found = [
        e
        for e in sim.store.list("events", "default")
        if e["involvedObject"]["name"] == name and reason in (None, e["reason"])
    ]
    return sorted(found, key=lambda e: e["metadata"]["resourceVersion"].zfill(12))


async def until_phase(sim: kubesim.Cluster, name: str, wanted: str) -> None:
    await eventually(
        lambda: phase(sim, name) == wanted,
        f"pod {name} {wanted}",
        state=lambda: {"phase": phase(sim, name), "events": [
            f"{e['reason']}: {e['message']}" for e in events(sim, name)]},
    )  # fmt: skip


class Contexts:
    """A runner that keeps each container's context and runs until stopped."""

    def __init__(self) -> None:
        self.seen: dict[str, PodContext] = {}

    async def __call__(self, ctx: PodContext) -> int:
        self.seen[f"{ctx.name}/{ctx.container_name}"] = ctx
        await ctx.stopping.wait()
        return 0

    async def context(self, sim: kubesim.Cluster, key: str) -> PodContext:
        await eventually(lambda: key in self.seen, f"{key} running", state=lambda: list(self.seen))
        return self.seen[key]


def mounted(image: str, *mounts: dict[str, Any], name: str = "main") -> dict[str, Any]:
    return {"name": name, "image": image, "volumeMounts": list(mounts)}


# ----- pods that finish --------------------------------------------------------------------------


async def test_commands_in_pods_that_are_not_restarted_run_to_completion(
    sim: kubesim.Cluster,
) -> None:
    command = {"name": "main", "image": "busybox:1.36", "command": ["sh", "-c", "echo hi"]}
    sim.store.create(pod("once", command, restartPolicy="Never"))
    args_only = {"name": "main", "image": "busybox:1.36", "args": ["echo", "hi"]}
    sim.store.create(pod("retry", args_only, restartPolicy="OnFailure"))
    sim.store.create(pod("server", command))  # restartPolicy Always: a command here is a server
    sim.store.create(pod("idle", restartPolicy="Never"))  # no command: the image's entrypoint
    await until_phase(sim, "once", "Succeeded")
    await until_phase(sim, "retry", "Succeeded")
    terminated = container_status(sim, "once")["state"]["terminated"]
    assert (terminated["exitCode"], terminated["reason"]) == (0, "Completed")
    assert condition(sim, "once", "Ready")["reason"] == "PodCompleted"
    assert condition(sim, "once", "Ready")["status"] == "False"
    await until_phase(sim, "server", "Running")
    await until_phase(sim, "idle", "Running")
    await asyncio.sleep(0)
    assert phase(sim, "server") == "Running"
    assert container_status(sim, "server")["restartCount"] == 0


async def test_runner_exit_codes_decide_the_phase(sim: kubesim.Cluster) -> None:
    attempts: dict[str, int] = {}

    async def flaky(ctx: PodContext) -> int:
        attempts[ctx.name] = attempts.get(ctx.name, 0) + 1
        if ctx.name == "broken":
            return 3
        return 0 if attempts[ctx.name] > 1 else 1

    sim.register_pod_runner(flaky, image="example/job")
    job = {"name": "main", "image": "example/job:1"}
    sim.store.create(pod("broken", job, restartPolicy="Never"))
    sim.store.create(pod("flaky", job, restartPolicy="OnFailure"))
    await until_phase(sim, "broken", "Failed")
    terminated = container_status(sim, "broken")["state"]["terminated"]
    assert (terminated["exitCode"], terminated["reason"]) == (3, "Error")
    await until_phase(sim, "flaky", "Succeeded")
    status = container_status(sim, "flaky")
    assert status["restartCount"] == 1
    assert status["lastState"]["terminated"]["exitCode"] == 1


async def test_crashing_container_backs_off_doubling_to_the_cap(sim: kubesim.Cluster) -> None:
    starts: list[float] = []

    async def crash(ctx: PodContext) -> int:
        starts.append(asyncio.get_running_loop().time())
        return 1

    sim.register_pod_runner(crash, image="example/crash")
    waiting: list[str] = []

    def backing_off(obj: dict[str, Any] | None) -> dict[str, Any]:
        statuses = ((obj or {}).get("status") or {}).get("containerStatuses") or [{}]
        state = (statuses[0].get("state") or {}).get("waiting") or {}
        return state if state.get("reason") == "CrashLoopBackOff" else {}

    def watch(event: Any) -> None:
        if event.key == ("", "pods") and event.new.obj["metadata"]["name"] == "crash":
            now = backing_off(event.new.obj)
            if now and not backing_off(event.old.obj if event.old else None):
                waiting.append(now["message"])

    unsubscribe = sim.store.subscribe(watch)
    sim.store.create(pod("crash", {"name": "main", "image": "example/crash:1"}))
    await sim.wait_for(lambda: len(starts) >= 6, DEADLINE, "six starts")
    unsubscribe()
    uid = get(sim, "crash")["metadata"]["uid"]
    assert waiting[:4] == [
        f"back-off {d} restarting failed container=main pod=crash_default({uid})"
        for d in ("50ms", "100ms", "200ms", "200ms")
    ]
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert gaps[1] >= 0.05
    assert gaps[2] >= 0.1
    assert gaps[3] >= 0.2
    backoff = events(sim, "crash", "BackOff")
    assert (
        backoff[0]["message"]
        == f"Back-off restarting failed container main in pod crash_default({uid})"
    )
    assert backoff[0]["type"] == "Warning"
    assert backoff[0]["involvedObject"]["fieldPath"] == "spec.containers{main}"
    assert container_status(sim, "crash")["restartCount"] >= 5


# ----- Events ------------------------------------------------------------------------------------


async def test_kubelet_records_pull_create_start_and_kill_events(sim: kubesim.Cluster) -> None:
    sim.store.create(pod("first"))
    await until_phase(sim, "first", "Running")
    first = events(sim, "first")
    assert [e["reason"] for e in first] == ["Pulling", "Pulled", "Created", "Started"]
    assert first[0]["message"] == 'Pulling image "example/app:1"'
    assert first[1]["message"].startswith('Successfully pulled image "example/app:1" in ')
    assert first[1]["message"].endswith(" bytes.")
    assert [e["message"] for e in first[2:]] == ["Container created", "Container started"]
    for event in first:
        assert event["involvedObject"]["fieldPath"] == "spec.containers{main}"
        assert event["source"] == {"component": "kubelet", "host": "node-1"}
    # IfNotPresent reuses the image the node already has; Always pulls again.
    sim.store.create(pod("second"))
    always = {"name": "main", "image": "example/app:1", "imagePullPolicy": "Always"}
    sim.store.create(pod("third", always))
    await until_phase(sim, "second", "Running")
    await until_phase(sim, "third", "Running")
    assert [e["reason"] for e in events(sim, "second")] == ["Pulled", "Created", "Started"]
    assert events(sim, "second", "Pulled")[0]["message"] == (
        'Container image "example/app:1" already present on machine and can be accessed by the pod'
    )
    assert [e["reason"] for e in events(sim, "third")][:2] == ["Pulling", "Pulled"]
    sim.store.delete("pods", "first", "default")
    await sim.wait_for(lambda: sim.store.get("pods", "first", "default") is None, DEADLINE, "gone")
    [killing] = events(sim, "first", "Killing")
    assert killing["message"] == "Stopping container main"


async def test_init_container_events_name_the_init_container(sim: kubesim.Cluster) -> None:
    sim.store.create(
        pod("with-init", initContainers=[{"name": "setup", "image": "example/setup:1"}])
    )
    await until_phase(sim, "with-init", "Running")
    paths = [e["involvedObject"].get("fieldPath") for e in events(sim, "with-init", "Started")]
    assert paths == ["spec.initContainers{setup}", "spec.containers{main}"]


async def test_node_lifecycle_events(sim: kubesim.Cluster) -> None:
    sim.add_node("gpu-1")
    node_events = [
        (e["reason"], e["message"], e["source"]["component"]) for e in events(sim, "gpu-1")
    ]
    assert node_events == [
        ("Starting", "Starting kubelet.", "kubelet"),
        ("NodeReady", "Node gpu-1 status is now: NodeReady", "kubelet"),
        (
            "RegisteredNode",
            "Node gpu-1 event: Registered Node gpu-1 in Controller",
            "node-controller",
        ),
    ]
    sim.store.create(pod("victim", node="gpu-1"))
    await until_phase(sim, "victim", "Running")
    sim.set_node_ready("gpu-1", False)
    [not_ready] = events(sim, "gpu-1", "NodeNotReady")
    assert not_ready["message"] == "Node gpu-1 status is now: NodeNotReady"
    [pod_event] = events(sim, "victim", "NodeNotReady")
    assert (pod_event["type"], pod_event["message"]) == ("Warning", "Node is not ready")
    assert pod_event["source"]["component"] == "node-controller"


async def test_instant_pods_settle_in_one_status_write() -> None:
    async with kubesim.Cluster(images=TEST_IMAGES, nodes=1, kubelet=instant(), events=False) as sim:
        writes: list[str] = []

        def count(event: Any) -> None:
            if event.key == ("", "pods") and event.type == "MODIFIED":
                writes.append(str(event.new.obj["metadata"]["name"]))

        sim.store.subscribe(count)
        sim.store.create(pod("server"))
        job = {"name": "main", "image": "busybox:1.36", "command": ["true"]}
        sim.store.create(pod("job", job, restartPolicy="Never"))
        await sim.wait_for(
            lambda: phase(sim, "server") == "Running" and phase(sim, "job") == "Succeeded",
            DEADLINE,
            "settled",
        )
        await sim.settle(timeout=DEADLINE)
        assert sorted(writes) == ["job", "server"]


# ----- node filesystems and volumes -------------------------------------------------------------


async def test_host_path_volumes_share_the_node_filesystem(sim: kubesim.Cluster) -> None:
    runner = Contexts()
    sim.register_pod_runner(runner, image="example/validator")
    volume = {
        "name": "validations",
        "hostPath": {"path": "/run/nvidia/validations", "type": "DirectoryOrCreate"},
    }
    container = mounted(
        "example/validator:1", {"name": "validations", "mountPath": "/run/nvidia/validations"}
    )
    for name, node in (("a", "node-1"), ("b", "node-1"), ("c", "node-2")):
        sim.store.create(pod(name, container, node=node, volumes=[volume]))
    a = await runner.context(sim, "a/main")
    b = await runner.context(sim, "b/main")
    c = await runner.context(sim, "c/main")
    a.path("/run/nvidia/validations/driver-ready", write=True).write_text("ok")
    assert b.path("/run/nvidia/validations/driver-ready").read_text() == "ok"
    assert not c.path("/run/nvidia/validations/driver-ready").exists()
    marker = sim.node_root("node-1") / "run/nvidia/validations/driver-ready"
    assert marker.read_text() == "ok"
    assert a.host_path("/run/nvidia/validations/driver-ready") == marker
    assert a.node_root == sim.node_root("node-1")


async def test_missing_host_path_keeps_the_pod_creating_until_it_appears(
    sim: kubesim.Cluster,
) -> None:
    volumes = [
        {"name": "containerd", "hostPath": {"path": "/etc/containerd", "type": "Directory"}},
        {"name": "sock", "hostPath": {"path": "/run/plugin.sock", "type": "Socket"}},
    ]
    sim.store.create(pod("toolkit", volumes=volumes))
    await sim.wait_for(
        lambda: len(events(sim, "toolkit", "FailedMount")) >= 2, DEADLINE, "FailedMount"
    )
    messages = {e["message"] for e in events(sim, "toolkit", "FailedMount")}
    assert messages == {
        'MountVolume.SetUp failed for volume "containerd" : '
        "hostPath type check failed: /etc/containerd is not a directory",
        'MountVolume.SetUp failed for volume "sock" : '
        "hostPath type check failed: /run/plugin.sock is not a socket file",
    }
    assert phase(sim, "toolkit") == "Pending"
    assert container_status(sim, "toolkit")["state"] == {"waiting": {"reason": "ContainerCreating"}}
    assert condition(sim, "toolkit", "PodReadyToStartContainers")["status"] == "False"
    root = sim.node_root("node-1")
    (root / "etc/containerd").mkdir()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        server.bind(str(root / "run/plugin.sock"))
        await until_phase(sim, "toolkit", "Running")
    finally:
        server.close()
    # The retry found what it waited for: no volume failed after that.
    assert condition(sim, "toolkit", "PodReadyToStartContainers")["status"] == "True"


async def test_host_path_file_types(sim: kubesim.Cluster) -> None:
    volumes = [
        {"name": "made", "hostPath": {"path": "/var/log/agent/made.log", "type": "FileOrCreate"}},
        {"name": "needed", "hostPath": {"path": "/etc/needed.conf", "type": "File"}},
        {"name": "untyped", "hostPath": {"path": "/var/lib/plugin"}},
    ]
    sim.store.create(pod("files", volumes=volumes))
    await sim.wait_for(lambda: events(sim, "files", "FailedMount"), DEADLINE, "FailedMount")
    root = sim.node_root("node-1")
    assert [e["message"] for e in events(sim, "files", "FailedMount")] == [
        'MountVolume.SetUp failed for volume "made" : open /var/log/agent/made.log: '
        "no such file or directory",
        'MountVolume.SetUp failed for volume "needed" : '
        "hostPath type check failed: /etc/needed.conf is not a file",
    ]
    assert (root / "var/lib/plugin").is_dir()  # untyped: the runtime creates a directory
    (root / "var/log/agent").mkdir()
    (root / "etc/needed.conf").write_text("x")
    await until_phase(sim, "files", "Running")
    assert (root / "var/log/agent/made.log").is_file()


async def test_configmap_volume_files_modes_and_atomic_updates(sim: kubesim.Cluster) -> None:
    runner = Contexts()
    sim.register_pod_runner(runner, image="example/gfd")
    sim.store.create(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "plugin-config", "namespace": "default"},
            "data": {"config.yaml": "version: v1\n", "other": "2"},
            "binaryData": {"blob": base64.b64encode(b"\x00\x01").decode()},
        }
    )
    volumes = [
        {"name": "all", "configMap": {"name": "plugin-config", "defaultMode": 0o440}},
        {
            "name": "picked",
            "configMap": {
                "name": "plugin-config",
                "items": [{"key": "config.yaml", "path": "sub/plugin.yaml", "mode": 0o400}],
            },
        },
    ]
    container = mounted(
        "example/gfd:1",
        {"name": "all", "mountPath": "/config"},
        {"name": "picked", "mountPath": "/picked", "readOnly": True},
        {"name": "all", "mountPath": "/etc/fixed.yaml", "subPath": "config.yaml"},
    )
    sim.store.create(pod("gfd", container, volumes=volumes))
    ctx = await runner.context(sim, "gfd/main")
    assert ctx.path("/config/config.yaml").read_text() == "version: v1\n"
    assert ctx.path("/config/blob").read_bytes() == b"\x00\x01"
    assert stat.S_IMODE(ctx.path("/config/other").stat().st_mode) == 0o440
    picked = ctx.path("/picked/sub/plugin.yaml")
    assert picked.read_text() == "version: v1\n"
    assert stat.S_IMODE(picked.stat().st_mode) == 0o400
    assert not ctx.path("/picked/other").exists()
    # The kubelet's layout: a `..data` link to a timestamped directory, a link per entry.
    directory = ctx.path("/config").parent / "all"
    assert os.readlink(directory / "..data").startswith("..")
    assert os.readlink(directory / "config.yaml") == "..data/config.yaml"
    first_version = os.readlink(directory / "..data")
    sim.store.patch(
        "configmaps", "plugin-config", {"data": {"config.yaml": "version: v2\n"}}, "default"
    )
    await sim.wait_for(
        lambda: ctx.path("/config/config.yaml").read_text() == "version: v2\n", DEADLINE, "update"
    )
    assert ctx.path("/picked/sub/plugin.yaml").read_text() == "version: v2\n"
    versions = [p.name for p in directory.iterdir() if p.name.startswith("..2")]
    assert first_version not in versions
    assert len(versions) == 1
    # A subPath mount is fixed when the container starts, as a bind mount of the file is.
    assert ctx.path("/etc/fixed.yaml").read_text() == "version: v1\n"
    with pytest.raises(PermissionError):
        ctx.path("/config/config.yaml", write=True)


async def test_missing_configmaps_and_keys_fail_the_mount_until_fixed(
    sim: kubesim.Cluster,
) -> None:
    runner = Contexts()
    sim.register_pod_runner(runner, image="example/reader")
    volumes = [
        {"name": "settings", "configMap": {"name": "settings"}},
        {"name": "maybe", "configMap": {"name": "absent", "optional": True}},
        {
            "name": "keyed",
            "configMap": {"name": "keyed", "items": [{"key": "nope", "path": "nope"}]},
        },
    ]
    container = mounted(
        "example/reader:1",
        {"name": "settings", "mountPath": "/settings"},
        {"name": "maybe", "mountPath": "/maybe"},
    )
    sim.store.create(pod("reader", container, volumes=volumes))
    keyed = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "keyed", "namespace": "default"},
        "data": {"yes": "1"},
    }
    sim.store.create(keyed)
    await sim.wait_for(
        lambda: len(events(sim, "reader", "FailedMount")) >= 2, DEADLINE, "FailedMount"
    )
    assert {e["message"] for e in events(sim, "reader", "FailedMount")} == {
        'MountVolume.SetUp failed for volume "settings" : configmap "settings" not found',
        'MountVolume.SetUp failed for volume "keyed" : '
        "configmap references non-existent config key: nope",
    }
    assert phase(sim, "reader") == "Pending"
    sim.store.patch("configmaps", "keyed", {"data": {"nope": "now"}}, "default")
    settings = {**keyed, "metadata": {"name": "settings", "namespace": "default"}}
    sim.store.create(settings)
    ctx = await runner.context(sim, "reader/main")
    assert ctx.path("/settings/yes").read_text() == "1"
    assert [p.name for p in ctx.path("/maybe").iterdir() if not p.name.startswith("..")] == []
    assert (ctx.path("/maybe") / "..data").is_symlink()


async def test_secret_volume(sim: kubesim.Cluster) -> None:
    runner = Contexts()
    sim.register_pod_runner(runner, image="example/secret-reader")
    sim.store.create(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "creds", "namespace": "default"},
            "data": {"token": base64.b64encode(b"s3cret").decode()},
        }
    )
    volumes = [{"name": "creds", "secret": {"secretName": "creds"}}]
    container = mounted("example/secret-reader:1", {"name": "creds", "mountPath": "/creds"})
    sim.store.create(pod("secretive", container, volumes=volumes))
    ctx = await runner.context(sim, "secretive/main")
    token = ctx.path("/creds/token")
    assert token.read_bytes() == b"s3cret"
    assert stat.S_IMODE(token.stat().st_mode) == 0o644
    missing = [{"name": "creds", "secret": {"secretName": "nowhere"}}]
    sim.store.create(pod("lost", container, volumes=missing))
    await sim.wait_for(lambda: events(sim, "lost", "FailedMount"), DEADLINE, "FailedMount")
    assert events(sim, "lost", "FailedMount")[0]["message"] == (
        'MountVolume.SetUp failed for volume "creds" : secret "nowhere" not found'
    )


async def test_empty_dir_is_private_to_the_pod_and_removed_with_it(sim: kubesim.Cluster) -> None:
    runner = Contexts()
    sim.register_pod_runner(runner, image="example/scratch")
    volumes = [{"name": "scratch", "emptyDir": {}}]
    writer = mounted("example/scratch:1", {"name": "scratch", "mountPath": "/scratch"})
    reader = mounted("example/scratch:1", {"name": "scratch", "mountPath": "/data"}, name="side")
    sim.store.create(pod("one", writer, reader, volumes=volumes))
    sim.store.create(pod("two", writer, volumes=volumes))
    one = await runner.context(sim, "one/main")
    side = await runner.context(sim, "one/side")
    two = await runner.context(sim, "two/main")
    one.path("/scratch/out.txt", write=True).write_text("mine")
    assert side.path("/data/out.txt").read_text() == "mine"
    assert not two.path("/scratch/out.txt").exists()
    pod_dir = sim.node_root("node-1") / "var/lib/kubelet/pods" / get(sim, "one")["metadata"]["uid"]
    assert (pod_dir / "volumes/kubernetes.io~empty-dir/scratch/out.txt").exists()
    # A node that goes NotReady and comes back keeps what its pods wrote.
    sim.set_node_ready("node-1", False)
    runner.seen.pop("one/main")
    sim.set_node_ready("node-1", True)
    again = await runner.context(sim, "one/main")
    assert again.path("/scratch/out.txt").read_text() == "mine"
    sim.store.delete("pods", "one", "default")
    await sim.wait_for(lambda: not pod_dir.exists(), DEADLINE, "pod directory removed")


async def test_downward_api_files_follow_labels_and_annotations(sim: kubesim.Cluster) -> None:
    runner = Contexts()
    sim.register_pod_runner(runner, image="example/info")
    volumes = [
        {
            "name": "info",
            "downwardAPI": {
                "items": [
                    {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
                    {"path": "name", "fieldRef": {"fieldPath": "metadata.name"}},
                    {"path": "tier", "fieldRef": {"fieldPath": "metadata.labels['tier']"}},
                    {
                        "path": "cpu-limit",
                        "resourceFieldRef": {"containerName": "main", "resource": "limits.cpu"},
                    },
                    {
                        "path": "mem-request",
                        "resourceFieldRef": {
                            "containerName": "main",
                            "resource": "requests.memory",
                            "divisor": "1Mi",
                        },
                    },
                ]
            },
        }
    ]
    container = mounted("example/info:1", {"name": "info", "mountPath": "/etc/podinfo"})
    container["resources"] = {"requests": {"memory": "64Mi"}}
    manifest = pod("info", container, volumes=volumes)
    manifest["metadata"]["labels"] = {"tier": "gold", "app": "x"}
    sim.store.create(manifest)
    ctx = await runner.context(sim, "info/main")
    assert ctx.path("/etc/podinfo/labels").read_text() == 'app="x"\ntier="gold"'
    assert ctx.path("/etc/podinfo/name").read_text() == "info"
    assert ctx.path("/etc/podinfo/tier").read_text() == "gold"
    assert ctx.path("/etc/podinfo/cpu-limit").read_text() == "16"  # node allocatable
    assert ctx.path("/etc/podinfo/mem-request").read_text() == "64"
    sim.store.patch("pods", "info", {"metadata": {"labels": {"tier": "silver"}}}, "default")
    await sim.wait_for(
        lambda: ctx.path("/etc/podinfo/tier").read_text() == "silver", DEADLINE, "label update"
    )


async def test_projected_volume_combines_its_sources(sim: kubesim.Cluster) -> None:
    runner = Contexts()
    sim.register_pod_runner(runner, image="example/projected")
    sim.store.create(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "ca", "namespace": "default"},
            "data": {"ca.crt": "CERT"},
        }
    )
    sim.store.create(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "key", "namespace": "default"},
            "data": {"tls.key": base64.b64encode(b"KEY").decode()},
        }
    )
    sources = [
        {"configMap": {"name": "ca"}},
        {"secret": {"name": "key", "items": [{"key": "tls.key", "path": "tls/key"}]}},
        {
            "downwardAPI": {
                "items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]
            }
        },
        {"serviceAccountToken": {"path": "token", "audience": "vault"}},
    ]
    volumes = [{"name": "access", "projected": {"sources": sources, "defaultMode": 0o420}}]
    container = mounted("example/projected:1", {"name": "access", "mountPath": "/var/run/access"})
    sim.store.create(pod("projected", container, volumes=volumes))
    ctx = await runner.context(sim, "projected/main")
    assert ctx.path("/var/run/access/ca.crt").read_text() == "CERT"
    assert ctx.path("/var/run/access/tls/key").read_bytes() == b"KEY"
    assert ctx.path("/var/run/access/namespace").read_text() == "default"
    token = ctx.path("/var/run/access/token").read_text()
    claims = token.split(".")[1]
    decoded = base64.urlsafe_b64decode(claims + "=" * (-len(claims) % 4)).decode()
    assert '"aud": ["vault"]' in decoded
    assert "system:serviceaccount:default:default" in decoded
    assert stat.S_IMODE(ctx.path("/var/run/access/ca.crt").stat().st_mode) == 0o420


async def test_container_paths_resolve_only_through_mounts_and_inside_the_node(
    sim: kubesim.Cluster,
) -> None:
    runner = Contexts()
    sim.register_pod_runner(runner, image="example/agent")
    volumes = [
        {"name": "host-etc", "hostPath": {"path": "/etc", "type": "Directory"}},
        {"name": "plugins", "hostPath": {"path": "/var/lib/kubelet/device-plugins"}},
        {"name": "logs", "hostPath": {"path": "/var/log/agent", "type": "DirectoryOrCreate"}},
    ]
    container = mounted(
        "example/agent:1",
        {"name": "host-etc", "mountPath": "/host/etc", "readOnly": True},
        {"name": "plugins", "mountPath": "/var/lib/kubelet/device-plugins"},
        {"name": "logs", "mountPath": "/logs", "subPathExpr": "$(POD_NAME)"},
    )
    container["env"] = [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
    ]
    sim.store.create(pod("agent", container, volumes=volumes))
    ctx = await runner.context(sim, "agent/main")
    with pytest.raises(PathNotMounted, match="no volumeMount covering /usr/bin/nvidia-smi"):
        ctx.path("/usr/bin/nvidia-smi")
    with pytest.raises(PermissionError):
        ctx.path("/host/etc/containerd/config.toml", write=True)
    root = sim.node_root("node-1")
    assert ctx.path("/host/etc/containerd/config.toml") == root / "etc/containerd/config.toml"
    assert ctx.path("/logs/agent.log") == root / "var/log/agent/agent/agent.log"
    assert (root / "var/log/agent/agent").is_dir()
    # Symlinks a program plants cannot lead out of the node's root.
    plugins = ctx.path("/var/lib/kubelet/device-plugins", write=True)
    (plugins / "escape").symlink_to("../../../../../../../../..")
    (plugins / "absolute").symlink_to("/etc/passwd")
    assert ctx.path("/var/lib/kubelet/device-plugins/escape/etc") == root / "etc"
    assert ctx.path("/var/lib/kubelet/device-plugins/absolute") == root / "etc/passwd"
    assert ctx.host_path("/var/lib/kubelet/device-plugins/absolute") == root / "etc/passwd"


async def test_pods_without_runners_get_checks_but_no_written_files(sim: kubesim.Cluster) -> None:
    volumes = [
        {"name": "cfg", "configMap": {"name": "absent", "optional": True}},
        {"name": "state", "hostPath": {"path": "/var/lib/state", "type": "DirectoryOrCreate"}},
    ]
    sim.store.create(pod("plain", volumes=volumes))
    await until_phase(sim, "plain", "Running")
    root = sim.node_root("node-1")
    assert (root / "var/lib/state").is_dir()
    assert not (root / "var/lib/kubelet/pods" / get(sim, "plain")["metadata"]["uid"]).exists()


async def test_node_roots_live_under_the_work_dir_and_go_with_the_cluster(
    tmp_path: Path,
) -> None:
    async with kubesim.Cluster(
        images=TEST_IMAGES, nodes=1, kubelet=instant(), work_dir=tmp_path
    ) as sim:
        root = sim.node_root("node-1")
        assert root == tmp_path / "nodes" / "node-1"
        # A fresh node looks like a Linux host: what operands mount with type Directory exists.
        for directory in ("sys", "proc", "dev/char", "var/log", "var/lib/kubelet/device-plugins"):
            assert (root / directory).is_dir(), directory
        assert sim.kubelet.host_path("node-1", "/var/run/cdi") == root / "run/cdi"
        release = (root / "etc/os-release").read_text()
        assert 'PRETTY_NAME="Ubuntu 24.04.1 LTS"' in release
        assert "ID=ubuntu" in release
        assert 'VERSION_ID="24.04"' in release
        sim.add_node("extra")
        extra = sim.node_root("extra")
        sim.remove_node("extra")
        await sim.wait_for(lambda: not extra.exists(), DEADLINE, "node tree removed")
    assert not (tmp_path / "nodes").exists()


async def test_node_filesystems_can_be_turned_off_for_scale_runs() -> None:
    async with kubesim.Cluster(
        images=TEST_IMAGES, nodes=1, kubelet=instant(), node_filesystems=False
    ) as sim:
        volumes = [{"name": "sys", "hostPath": {"path": "/nowhere", "type": "Directory"}}]
        sim.store.create(pod("unchecked", volumes=volumes))
        await until_phase(sim, "unchecked", "Running")
        with pytest.raises(RuntimeError, match="node_filesystems=False"):
            sim.node_root("node-1")


async def test_status_writes_of_many_pods_give_the_loop_a_turn_every_slice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A thousand pods settling at once wrote their statuses in one 0.1 s callback, holding the
    API server's loop; now the kubelet writes a slice's worth and continues on the next turn."""
    from kubesim.controllers import kubelet as kubelet_module
    from kubesim.store import Store

    monkeypatch.setattr(kubelet_module, "SLICE_SECONDS", 0.0)  # a slice is one pod
    writes = 0
    replace = Store.replace

    def counting(self: Store, *args: Any, **kwargs: Any) -> Any:
        nonlocal writes
        if kwargs.get("subresource") == "status":
            writes += 1
        return replace(self, *args, **kwargs)

    flushes: list[tuple[int, int]] = []  # (pods waiting, status writes) per call
    flush = kubelet_module.Kubelet._flush

    def recording(self: kubelet_module.Kubelet) -> None:
        waiting, before = len(self._dirty), writes
        flush(self)
        flushes.append((waiting, writes - before))

    monkeypatch.setattr(Store, "replace", counting)
    monkeypatch.setattr(kubelet_module.Kubelet, "_flush", recording)
    async with kubesim.Cluster(images=TEST_IMAGES, nodes=1, kubelet=instant()) as sim:
        names = [f"p{i}" for i in range(30)]
        for name in names:
            sim.store.create(pod(name))
        await eventually(
            lambda: all(get(sim, n).get("status", {}).get("phase") == "Running" for n in names),
            "every pod Running",
        )
    assert max(waiting for waiting, _ in flushes) > 1  # several pods settled together
    assert max(written for _, written in flushes) == 1


# ----- per-pod cost ------------------------------------------------------------------------------


def _statuses(sim: kubesim.Cluster, name: str) -> list[dict[str, Any]]:
    return list((get(sim, name).get("status") or {}).get("containerStatuses") or [])


def _worker_tasks() -> list[str]:
    """The pending tasks that run a kubelet pod worker's coroutines."""
    names = []
    for task in asyncio.all_tasks():
        coro = task.get_coro()
        qualname = getattr(coro, "__qualname__", "")
        if qualname.startswith("_PodWorker.") or "_container_loop" in repr(coro):
            names.append(qualname)
    return names


async def test_containers_without_a_program_keep_no_coroutine_until_the_pod_stops() -> None:
    """A container with nothing to run (no runner, program, stdin or command that ends) used
    to keep a waiting coroutine chain, a task and futures per container for the pod's life:
    hundreds of megabytes at 20,000 nodes. It is parked instead and runs as before: its
    instance stays running (exec and logs use it; test_kubesim_programs execs into such
    containers), it is ready, and stopping the pod ends it as the cancelled wait did."""
    async with kubesim.Cluster(images=TEST_IMAGES, nodes=1, kubelet=instant()) as sim:
        for index in range(5):
            sim.store.create(
                pod(
                    f"idle-{index}",
                    {"name": "main", "image": "example/app:1"},
                    {"name": "side", "image": "example/app:1"},
                    initContainers=[{"name": "setup", "image": "example/setup:1"}],
                )
            )
        sim.store.create(pod("single"))
        names = [*(f"idle-{i}" for i in range(5)), "single"]
        await eventually(
            lambda: all(
                phase(sim, n) == "Running" and all(s["ready"] for s in _statuses(sim, n))
                for n in names
            ),
            "every pod Running and ready",
        )
        await sim.settle(timeout=DEADLINE)
        assert _worker_tasks() == []
        runtime = sim.kubelet.runtime
        uid = get(sim, "idle-0")["metadata"]["uid"]
        instances = [runtime.current(uid, name) for name in ("setup", "main", "side")]
        assert [i.running if i is not None else None for i in instances] == [False, True, True]
        assert [list(s["state"]) for s in _statuses(sim, "idle-0")] == [["running"], ["running"]]
        # Stopping the pod ends its parked containers, as cancelling their wait did.
        sim.store.delete("pods", "idle-0", "default")
        await sim.wait_for(
            lambda: sim.store.get("pods", "idle-0", "default") is None, DEADLINE, "gone"
        )
        assert [i.running if i is not None else None for i in instances] == [False, False, False]
        assert all(i is not None and i.log.closed for i in instances)
        assert [e["message"] for e in events(sim, "idle-0", "Killing")] == [
            "Stopping container main",
            "Stopping container side",
        ]


async def test_a_parked_container_leaves_its_pod_running_when_another_one_ends(
    sim: kubesim.Cluster,
) -> None:
    """With delays (FAST): the parked container still becomes ready after `ready_delay`, and
    the pod stays Running when its other container completes (restartPolicy Never), as it did
    while a coroutine waited for the parked one."""

    async def finishes(ctx: PodContext) -> int:
        return 0

    sim.register_pod_runner(finishes, image="example/job")
    sim.store.create(
        pod(
            "mixed",
            {"name": "job", "image": "example/job:1"},
            {"name": "idle", "image": "example/app:1"},
            restartPolicy="Never",
        )
    )
    await eventually(
        lambda: (
            [tuple(s["state"]) for s in _statuses(sim, "mixed")] == [("terminated",), ("running",)]
        ),
        "job terminated, idle running",
        state=lambda: _statuses(sim, "mixed"),
    )
    await eventually(
        lambda: _statuses(sim, "mixed")[1]["ready"],
        "idle ready",
        state=lambda: _statuses(sim, "mixed"),
    )
    await sim.settle(timeout=DEADLINE)
    assert phase(sim, "mixed") == "Running"
    assert _worker_tasks() == []


async def test_status_writes_never_change_a_stored_pod_afterwards() -> None:
    """The kubelet's status writes share the states and conditions it only ever replaces with
    the stored pod instead of deep-copying them: every stored version keeps the JSON it was
    committed with, through restarts, readiness changes and the pod's end."""
    seen: list[tuple[Any, bytes]] = []
    attempts = 0

    async def flaky(ctx: PodContext) -> int:
        nonlocal attempts
        attempts += 1
        ctx.set_ready(True)
        await asyncio.sleep(0.01)
        ctx.set_ready(False)
        ctx.write_termination_message(f"attempt {attempts}")
        return 1 if attempts < 3 else 0

    config = KubeletConfig(
        instant=True, lease_interval=None, restart_delay=0.01, restart_delay_max=0.02
    )
    async with kubesim.Cluster(images=TEST_IMAGES, nodes=1, kubelet=config) as sim:
        from kubesim.store import dumps

        def record(event: Any) -> None:
            if event.key == ("", "pods"):
                seen.append((event.new, dumps(event.new.obj)))

        sim.store.subscribe(record)
        sim.register_pod_runner(flaky, image="example/flaky", reports_readiness=True)
        sim.store.create(
            pod(
                "restarts",
                {"name": "flaky", "image": "example/flaky:1"},
                {"name": "idle", "image": "example/app:1"},
                restartPolicy="OnFailure",
                initContainers=[{"name": "setup", "image": "example/setup:1"}],
            )
        )
        sim.store.create(pod("neighbour"))  # same node: shares the hostIPs list
        await eventually(
            lambda: (
                [
                    s["state"].get("terminated", {}).get("exitCode")
                    for s in _statuses(sim, "restarts")
                ]
                == [0, None]
            ),
            "flaky completed after two restarts",
            state=lambda: _statuses(sim, "restarts"),
        )
        assert _statuses(sim, "restarts")[0]["restartCount"] == 2
        sim.store.delete("pods", "restarts", "default")
        await sim.wait_for(
            lambda: sim.store.get("pods", "restarts", "default") is None, DEADLINE, "gone"
        )
        await sim.settle(timeout=DEADLINE)
    modified = [raw for stored, raw in seen if dumps(stored.obj) != raw]
    assert len(seen) > 8
    assert modified == []


async def test_status_writes_do_not_requeue_the_pods_they_describe(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each status write to a running pod (the kubelet's own, mostly) used to requeue it for a
    reconcile that found nothing to do; now only changes the kubelet acts on do: labels and
    annotations, ephemeral containers, deletion."""
    from kubesim.controllers import kubelet as kubelet_module

    reconciled: list[Any] = []
    reconcile = kubelet_module.Kubelet.reconcile

    def recording(self: kubelet_module.Kubelet, key: Any) -> None:
        if key[0] == "pod":
            reconciled.append(key[2])
        reconcile(self, key)

    monkeypatch.setattr(kubelet_module.Kubelet, "reconcile", recording)
    async with kubesim.Cluster(images=TEST_IMAGES, nodes=1, kubelet=instant()) as sim:
        sim.store.create(pod("server", {"name": "a", "image": "example/app:1"},
                             {"name": "b", "image": "example/app:1"}))  # fmt: skip
        await until_phase(sim, "server", "Running")
        await sim.settle(timeout=DEADLINE)
        assert reconciled == ["server"]  # created; its status writes requeue nothing
        sim.store.patch("pods", "server", {"metadata": {"labels": {"tier": "web"}}}, "default")
        await sim.settle(timeout=DEADLINE)
        assert reconciled == ["server", "server"]
        sim.store.delete("pods", "server", "default")
        await sim.wait_for(
            lambda: sim.store.get("pods", "server", "default") is None, DEADLINE, "gone"
        )
        assert reconciled[2:3] == ["server"]
        assert [e["message"] for e in events(sim, "server", "Killing")] == [
            "Stopping container a",
            "Stopping container b",
        ]
