"""Images: which exist (kubesim.images), and what the kubelet does when one cannot be pulled
(InvalidImageName, ErrImageNeverPull, ErrImagePull then ImagePullBackOff with its back-off), as
Events, container states, `kubectl get/describe/logs` show it."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from kubesim_helpers import KUBECTL, TEST_IMAGES, kubectl, needs_kubectl
from waiting import DEADLINE, eventually, within

import kubesim
from kubesim import KubeletConfig, images
from kubesim.tables import pod_status_text

FAKE = "images.my-company.example/app:v4"
NO_SUCH_HOST = (
    'failed to pull and unpack image "images.my-company.example/app:v4": failed to resolve '
    'image: failed to do request: Head "https://images.my-company.example/v2/app/manifests/v4": '
    "dial tcp: lookup images.my-company.example on 127.0.0.53:53: no such host"
)
# Image pulls retried quickly, so that a test sees several attempts and a recovery.
QUICK = {
    "start_delay": 0.01,
    "ready_delay": 0.01,
    "pull_delay": 0.01,
    "image_pull_backoff": 0.2,
    "image_pull_backoff_max": 0.4,
    "image_pull_resync": 0.05,
    "lease_interval": None,
}


# ----- references and the catalog (pure) --------------------------------------------------------


@pytest.mark.parametrize(
    ("image", "normalized"),
    [
        ("nginx", "docker.io/library/nginx:latest"),
        ("nginx:1.27", "docker.io/library/nginx:1.27"),
        ("example/app:1", "docker.io/example/app:1"),
        ("index.docker.io/library/busybox:1.36", "docker.io/library/busybox:1.36"),
        (
            "nvcr.io/nvidia/driver:580.95.05-ubuntu22.04",
            "nvcr.io/nvidia/driver:580.95.05-ubuntu22.04",
        ),
        ("localhost:5000/app", "localhost:5000/app:latest"),
        (f"busybox:1.36@sha256:{'a' * 64}", f"docker.io/library/busybox@sha256:{'a' * 64}"),
    ],
)
def test_references_normalize_as_containerd_names_them(image: str, normalized: str) -> None:
    assert str(images.parse(image)) == normalized


@pytest.mark.parametrize(
    ("image", "error"),
    [
        ("Nginx", "invalid reference format: repository name (library/Nginx) must be lowercase"),
        (
            "example/App:1",
            "invalid reference format: repository name (example/App) must be lowercase",
        ),
        ("nginx:", "invalid reference format"),
        ("nginx:1 .2", "invalid reference format"),
        (
            "a" * 64,
            f"invalid repository name ({'a' * 64}), cannot specify 64-byte hexadecimal strings",
        ),
        (f"nginx@sha256:{'a' * 31}", "invalid reference format"),
        (f"nginx@sha256:{'a' * 63}", "invalid checksum digest length"),
        (f"nginx@sha256:{'a' * 65}", "invalid checksum digest length"),
        (f"nginx@md5:{'a' * 32}", "unsupported digest algorithm"),
    ],
)
def test_names_the_kubelet_cannot_parse_carry_the_parsers_message(image: str, error: str) -> None:
    with pytest.raises(images.InvalidReference) as raised:
        images.parse(image)
    assert str(raised.value) == error


def test_the_image_step_follows_the_pull_policy_and_what_the_node_has() -> None:
    on_node = {"docker.io/library/nginx:latest"}
    assert images.image_step("nginx", "IfNotPresent", on_node).action == "present"
    # The node knows the image by its normalized name, however a pod spells it.
    assert images.image_step("docker.io/library/nginx", "Never", on_node).action == "present"
    assert images.image_step("nginx", "Always", on_node).action == "pull"
    assert images.image_step("busybox", "IfNotPresent", on_node) == images.ImageStep(
        "pull", "docker.io/library/busybox:latest"
    )
    assert images.image_step("busybox", "Never", on_node) == images.ImageStep(
        "never",
        "docker.io/library/busybox:latest",
        'Container image "busybox" is not present with pull policy of Never',
    )
    assert images.image_step("Busybox:1", "IfNotPresent", on_node) == images.ImageStep(
        "invalid",
        "",
        'Failed to apply default image tag "Busybox:1": couldn\'t parse image name "Busybox:1": '
        "invalid reference format: repository name (library/Busybox) must be lowercase",
    )


def test_the_default_catalog_has_real_public_images_and_refuses_made_up_ones() -> None:
    catalog = images.ImageCatalog()
    for real in (
        "busybox",
        "nginx:1.27",
        "ubuntu:noble",
        "registry.k8s.io/pause:3.10",
        "nvcr.io/nvidia/cuda:12.4.0-base-ubuntu22.04",
        "nvcr.io/nvidia/k8s-device-plugin:v0.20.0",
        "registry.k8s.io/nfd/node-feature-discovery:v0.19.0",
        f"nginx@sha256:{'b' * 64}",
    ):
        assert catalog.pull(real) is None, real
    # A host no DNS knows: gRPC Unknown, whose code the kubelet leaves out of the message.
    unknown_host = catalog.pull(FAKE)
    assert unknown_host is not None
    assert (unknown_host.code, unknown_host.message) == ("Unknown", NO_SUCH_HOST)
    # Docker Hub answers a repository it does not have with an authorization error.
    denied = catalog.pull("example/app:1")
    assert denied is not None
    assert denied.message == (
        'failed to pull and unpack image "docker.io/example/app:1": failed to resolve image: '
        "pull access denied, repository does not exist or may require authorization: server "
        "message: insufficient_scope: authorization failed"
    )
    # A registry that answers, without the tag: NotFound, with the code in the message.
    missing_tag = catalog.pull("nginx:doesnotexist")
    assert missing_tag is not None
    assert missing_tag.message == (
        'rpc error: code = NotFound desc = failed to pull and unpack image "docker.io/library/'
        'nginx:doesnotexist": failed to resolve image: docker.io/library/nginx:doesnotexist: not '
        "found"
    )
    refused = catalog.pull("localhost:5000/app:1")
    assert refused is not None
    assert refused.message.endswith(
        'Head "http://localhost:5000/v2/app/manifests/1": dial tcp 127.0.0.1:5000: connect: '
        "connection refused"
    )


def test_catalog_patterns_add_images_and_registries() -> None:
    catalog = images.ImageCatalog(["registry.local/*", "example/app:1", "example/web"])
    assert catalog.pull("registry.local/team/agent:2") is None
    assert catalog.pull("example/app:1") is None
    assert catalog.pull("example/web@sha256:" + "c" * 64) is None
    assert catalog.pull("example/web:anything") is None
    other_tag = catalog.pull("example/app:2")
    assert other_tag is not None
    assert other_tag.code == "NotFound"
    catalog.add_registry("mirror.example:5000")
    empty = catalog.pull("mirror.example:5000/app:1")
    assert empty is not None
    assert empty.message.endswith("mirror.example:5000/app:1: not found")
    catalog.add("mirror.example:5000/app:1")
    assert catalog.pull("mirror.example:5000/app:1") is None
    assert images.ImageCatalog(["*/*"], defaults=False).pull(FAKE) is None
    strict = images.ImageCatalog(defaults=False, registries=())
    assert strict.pull("nginx") is not None
    for bad in ("", "nginx@sha256:abc", "a b", "Example/App:1", "example/app:"):
        with pytest.raises(ValueError, match="image pattern"):
            images.entry(bad)
    with pytest.raises(ValueError, match="registry"):
        catalog.add_registry("host/path")


def test_remembered_pull_answers_follow_catalog_changes() -> None:
    # Answers are remembered per image (thousands of nodes pull the same few): a registry or an
    # image added later changes them at once, and an unparsable name keeps its error.
    catalog = images.ImageCatalog(defaults=False, registries=())
    unreachable = catalog.pull("mirror.example:5000/app:1")
    assert unreachable is not None
    assert "no such host" in unreachable.message
    assert catalog.pull("mirror.example:5000/app:1") == unreachable
    catalog.add_registry("mirror.example:5000")
    missing = catalog.pull("mirror.example:5000/app:1")
    assert missing is not None
    assert missing.code == "NotFound"
    catalog.add("mirror.example:5000/app:*")
    assert catalog.pull("mirror.example:5000/app:1") is None
    for _ in range(2):
        with pytest.raises(images.InvalidReference, match="must be lowercase"):
            images.parse("Example/App:1")


def test_image_back_off_doubles_from_10s_to_the_5_minute_cap_and_starts_over() -> None:
    delays: list[float] = []
    delay: float | None = None
    for _ in range(7):
        delay = images.next_backoff(delay, 1.0, 10.0, 300.0)
        delays.append(delay)
    assert delays == [10.0, 20.0, 40.0, 80.0, 160.0, 300.0, 300.0]
    # A failure more than twice the cap after the last one starts from the initial delay again.
    assert images.next_backoff(300.0, 601.0, 10.0, 300.0) == 10.0


# ----- the kubelet ---------------------------------------------------------------------------


@pytest.fixture
async def sim() -> AsyncIterator[kubesim.Cluster]:
    async with kubesim.Cluster(
        nodes=1, kubelet=KubeletConfig(**QUICK), images=TEST_IMAGES
    ) as cluster:
        yield cluster


def pod(name: str, image: str, **container: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"containers": [{"name": "main", "image": image, **container}]},
    }


def get(sim: kubesim.Cluster, name: str) -> dict[str, Any]:
    found = sim.store.get("pods", name, "default")
    assert found is not None, name
    return found


def waiting(sim: kubesim.Cluster, name: str) -> dict[str, Any]:
    statuses = (get(sim, name).get("status") or {}).get("containerStatuses") or [{}]
    return dict((statuses[0].get("state") or {}).get("waiting") or {})


def events(sim: kubesim.Cluster, name: str) -> list[tuple[str, str, str]]:
    found = [
        e
        for e in sim.store.list("events", "default")
        if e["involvedObject"]["name"] == name and e["source"].get("component") == "kubelet"
    ]
    found.sort(key=lambda e: e["metadata"]["resourceVersion"].zfill(12))
    return [(e["type"], e["reason"], e["message"]) for e in found]


class States:
    """Every waiting state a pod's first container went through, in order."""

    def __init__(self, sim: kubesim.Cluster, name: str) -> None:
        self.seen: list[tuple[str, str]] = []

        def listener(event: Any) -> None:
            obj = event.new.obj
            if obj.get("kind") != "Pod" or obj["metadata"]["name"] != name:
                return
            statuses = (obj.get("status") or {}).get("containerStatuses") or [{}]
            state = (statuses[0].get("state") or {}).get("waiting")
            if state and (
                not self.seen or self.seen[-1] != (state["reason"], state.get("message", ""))
            ):
                self.seen.append((state["reason"], state.get("message", "")))

        self.stop = sim.store.subscribe(listener, [("", "pods")])

    def reasons(self) -> list[str]:
        return [reason for reason, _ in self.seen]


async def test_an_image_nobody_serves_fails_to_pull_then_backs_off_as_the_kubelet_reports_it(
    sim: kubesim.Cluster,
) -> None:
    states = States(sim, "app")
    sim.store.create(pod("app", FAKE))
    await eventually(
        lambda: states.reasons().count("ImagePullBackOff") >= 2,
        "two rounds of ErrImagePull and ImagePullBackOff",
        state=lambda: states.seen,
    )
    states.stop()
    assert states.seen[:4] == [
        ("ContainerCreating", ""),
        ("ErrImagePull", NO_SUCH_HOST),
        ("ImagePullBackOff", f'Back-off pulling image "{FAKE}": ErrImagePull: {NO_SUCH_HOST}'),
        ("ErrImagePull", NO_SUCH_HOST),
    ]
    assert events(sim, "app")[:5] == [
        ("Normal", "Pulling", f'Pulling image "{FAKE}"'),
        ("Warning", "Failed", f'Failed to pull image "{FAKE}": {NO_SUCH_HOST}'),
        ("Warning", "Failed", "Error: ErrImagePull"),
        ("Normal", "BackOff", f'Back-off pulling image "{FAKE}"'),
        ("Warning", "Failed", "Error: ImagePullBackOff"),
    ]
    assert get(sim, "app")["status"]["phase"] == "Pending"
    assert pod_status_text(get(sim, "app")) in ("ErrImagePull", "ImagePullBackOff")


async def test_the_next_retry_pulls_an_image_once_the_registry_has_it(
    sim: kubesim.Cluster,
) -> None:
    sim.store.create(pod("late", "nginx:nonexistent"))
    await eventually(lambda: waiting(sim, "late").get("reason") == "ImagePullBackOff", "back-off")
    assert waiting(sim, "late")["message"].endswith(
        "failed to resolve image: docker.io/library/nginx:nonexistent: not found"
    )
    sim.store.create(pod("private", "registry.example.com/team/app:1"))
    await eventually(
        lambda: waiting(sim, "private").get("reason") == "ImagePullBackOff", "back-off"
    )
    sim.images.add("nginx:nonexistent", "registry.example.com/team/*")
    for name in ("late", "private"):
        await eventually(
            lambda name=name: get(sim, name)["status"].get("phase") == "Running",
            f"{name} running once its image exists",
            state=lambda name=name: events(sim, name),
        )
        reasons = [reason for _, reason, _ in events(sim, name)]
        assert reasons[-4:] == ["Pulling", "Pulled", "Created", "Started"]


async def test_never_pull_policy_waits_for_the_image_on_the_node(sim: kubesim.Cluster) -> None:
    sim.store.create(pod("offline", "example/tool:3", imagePullPolicy="Never"))
    message = 'Container image "example/tool:3" is not present with pull policy of Never'
    await eventually(
        lambda: waiting(sim, "offline") == {"reason": "ErrImageNeverPull", "message": message},
        "ErrImageNeverPull",
        state=lambda: waiting(sim, "offline"),
    )
    assert events(sim, "offline")[:2] == [
        ("Warning", "ErrImageNeverPull", message),
        ("Warning", "Failed", "Error: ErrImageNeverPull"),
    ]
    # Never is never pulled, even though the registry has the image; a loaded image is used.
    assert not [e for e in events(sim, "offline") if e[1] == "Pulling"]
    sim.load_image("docker.io/example/tool:3")
    await eventually(lambda: get(sim, "offline")["status"].get("phase") == "Running", "running")
    assert (
        "Normal",
        "Pulled",
        'Container image "example/tool:3" already present on machine and can be accessed by '
        "the pod",
    ) in events(sim, "offline")


async def test_a_pull_takes_a_moment_by_default() -> None:
    """The default pull is short but not instant: a client that looks right after creating a
    pod finds its container being created, as on a cluster."""
    async with kubesim.Cluster(nodes=1, kubelet=KubeletConfig(lease_interval=None)) as sim:
        sim.store.create(pod("web", "nginx:1.27"))
        await eventually(lambda: get(sim, "web")["status"].get("phase") == "Running", "running")
        [pulled] = [m for _, reason, m in events(sim, "web") if reason == "Pulled"]
        took = pulled.removeprefix('Successfully pulled image "nginx:1.27" in ').split(" ")[0]
        seconds = float(took[:-2]) / 1000 if took.endswith("ms") else float(took[:-1])
        assert seconds >= KubeletConfig.pull_delay == 0.2, pulled


async def test_a_name_the_kubelet_cannot_parse_is_invalid_image_name(sim: kubesim.Cluster) -> None:
    sim.store.create(pod("typo", "Nginx:1.27"))
    message = (
        'Failed to apply default image tag "Nginx:1.27": couldn\'t parse image name "Nginx:1.27": '
        "invalid reference format: repository name (library/Nginx) must be lowercase"
    )
    await eventually(
        lambda: waiting(sim, "typo") == {"reason": "InvalidImageName", "message": message},
        "InvalidImageName",
        state=lambda: waiting(sim, "typo"),
    )
    assert events(sim, "typo")[:2] == [
        ("Warning", "InspectFailed", message),
        ("Warning", "Failed", "Error: InvalidImageName"),
    ]
    assert pod_status_text(get(sim, "typo")) == "InvalidImageName"


async def test_an_init_container_that_cannot_pull_holds_the_pod_in_init(
    sim: kubesim.Cluster,
) -> None:
    manifest = pod("gated", "nginx")
    manifest["spec"]["initContainers"] = [{"name": "setup", "image": "example/setup:1"}]
    manifest["spec"]["initContainers"].append({"name": "fetch", "image": "ghcr.io/none/x:1"})
    sim.store.create(manifest)
    await eventually(
        lambda: pod_status_text(get(sim, "gated")) == "Init:ImagePullBackOff",
        "Init:ImagePullBackOff",
        state=lambda: pod_status_text(get(sim, "gated")),
    )
    status = get(sim, "gated")["status"]
    assert status["containerStatuses"][0]["state"] == {"waiting": {"reason": "PodInitializing"}}
    assert status["initContainerStatuses"][1]["state"]["waiting"]["message"].endswith(
        'ghcr.io/none/x:1": failed to resolve image: ghcr.io/none/x:1: not found'
    )


async def test_a_debug_containers_image_is_pulled_like_any_other(sim: kubesim.Cluster) -> None:
    sim.store.create(pod("web", "nginx:1.27"))
    await eventually(lambda: get(sim, "web")["status"].get("phase") == "Running", "running")
    async with aiohttp.ClientSession(base_url=sim.url) as http:
        debugger = {"name": "dbg", "image": FAKE, "stdin": True}
        async with http.patch(
            "/api/v1/namespaces/default/pods/web/ephemeralcontainers",
            json={"spec": {"ephemeralContainers": [debugger]}},
            headers={"Content-Type": "application/strategic-merge-patch+json"},
        ) as response:
            assert response.status == 200, await response.text()

    def debug_state() -> dict[str, Any]:
        statuses = get(sim, "web")["status"].get("ephemeralContainerStatuses") or [{}]
        return dict(statuses[0].get("state") or {})

    await eventually(
        lambda: debug_state().get("waiting", {}).get("reason") == "ImagePullBackOff",
        "the debug container in ImagePullBackOff",
        state=debug_state,
    )
    failed = [m for _, reason, m in events(sim, "web") if reason == "Failed"]
    assert f'Failed to pull image "{FAKE}": {NO_SUCH_HOST}' in failed
    sim.images.add("images.my-company.example/*")
    await eventually(lambda: "running" in debug_state(), "the debug container running")


# ----- real kubectl ------------------------------------------------------------------------------


@needs_kubectl
@pytest.mark.parametrize(
    ("reason", "logs", "config"),
    [
        # The kubelet's next look is far away: the container stays in ErrImagePull.
        ("ErrImagePull", "image can't be pulled", {"image_pull_resync": 10 * DEADLINE}),
        # The back-off is long: after its next look the container stays in ImagePullBackOff.
        ("ImagePullBackOff", "trying and failing to pull image", {"image_pull_resync": 0.05}),
    ],
)
async def test_kubectl_run_of_an_image_nobody_serves(
    reason: str, logs: str, config: dict[str, float]
) -> None:
    kubelet = KubeletConfig(
        pull_delay=0.01, image_pull_backoff=10 * DEADLINE, lease_interval=None, **config
    )
    async with kubesim.Cluster(nodes=1, kubelet=kubelet) as sim:
        assert "pod/x created" in await kubectl(sim, "run", "x", f"--image={FAKE}")

        async def shown() -> str:
            return await kubectl(sim, "get", "pod", "x", "--no-headers")

        table = await eventually(
            lambda: _showing(shown, reason), f"kubectl get pod x showing {reason}"
        )
        assert table.split()[:4] == ["x", "0/1", reason, "0"]
        described = await kubectl(sim, "describe", "pod", "x")
        assert "    State:          Waiting\n" in described
        assert f"      Reason:       {reason}\n" in described
        for line in (
            f'Pulling image "{FAKE}"',
            f'Failed to pull image "{FAKE}": {NO_SUCH_HOST}',
            "Error: ErrImagePull",
        ):
            assert line in described, (line, described)
        if reason == "ImagePullBackOff":
            assert f'Back-off pulling image "{FAKE}"' in described
            assert "Error: ImagePullBackOff" in described
        out = await kubectl(sim, "logs", "x", check=False)
        assert out.strip() == (
            f'Error from server (BadRequest): container "x" in pod "x" is waiting to start: {logs}'
        )


async def _showing(shown: Any, reason: str) -> str | None:
    table = str(await shown())
    return table if reason in table.split() else None


@needs_kubectl
async def test_kubectl_logs_right_after_kubectl_run_meets_container_creating() -> None:
    # A pull longer than any wait here: the container is still being created when asked.
    kubelet = KubeletConfig(pull_delay=10 * DEADLINE, lease_interval=None)
    async with kubesim.Cluster(nodes=1, kubelet=kubelet) as sim:
        await kubectl(sim, "run", "web", "--image=nginx:1.27")
        out = await kubectl(sim, "logs", "web", check=False)
        assert out.strip() == (
            'Error from server (BadRequest): container "web" in pod "web" is waiting to start: '
            "ContainerCreating"
        )
        table = await kubectl(sim, "get", "pod", "web", "--no-headers")
        assert table.split()[:3] == ["web", "0/1", "ContainerCreating"]
        described = await kubectl(sim, "describe", "pod", "web")
        assert 'Pulling image "nginx:1.27"' in described


@needs_kubectl
async def test_kubesim_serve_takes_images_registries_and_the_pull_delay(tmp_path: Path) -> None:
    config = tmp_path / "kubeconfig"
    binary = str(Path(sys.executable).parent / "kubesim")
    bad = await asyncio.create_subprocess_exec(
        binary, "serve", "--image", "Registry.local/x y", stderr=asyncio.subprocess.PIPE
    )
    _, err = await within(bad.communicate(), "kubesim serve refusing a bad --image")
    assert bad.returncode == 2
    assert "image pattern 'Registry.local/x y'" in err.decode()
    proc = await asyncio.create_subprocess_exec(
        binary, "serve", "--nodes", "1", "--kubeconfig-out", str(config),
        "--image", "registry.local/*", "--registry", "mirror.example:5000", "--pull-delay", "0",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.stdout is not None
    try:
        await within(proc.stdout.readline(), "the served URL")

        async def run(*args: str) -> str:
            client = await asyncio.create_subprocess_exec(
                str(KUBECTL), "--kubeconfig", str(config), *args,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            )  # fmt: skip
            out, _ = await within(client.communicate(), f"kubectl {' '.join(args)}")
            return out.decode()

        await run("run", "ours", "--image=registry.local/team/agent:2")
        await run("run", "mirror", "--image=mirror.example:5000/app:1")
        await run("run", "fake", f"--image={FAKE}")

        async def message(name: str) -> str:
            path = "{.status.containerStatuses[0].state.waiting.message}"
            return await run("get", "pod", name, "-o", f"jsonpath={path}")

        await eventually(
            lambda: _contains(run("get", "pod", "ours", "--no-headers"), " Running "), "running"
        )
        await eventually(lambda: _contains(message("mirror"), "app:1: not found"), "not found")
        await eventually(lambda: _contains(message("fake"), "no such host"), "no such host")
    finally:
        proc.terminate()
        assert await within(proc.wait(), "kubesim serve to exit") == 0


async def _contains(text: Awaitable[str], part: str) -> bool:
    return part in await text
