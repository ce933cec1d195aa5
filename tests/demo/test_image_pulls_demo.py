"""Image pulls on the served demo, driven with the real kubectl as a user does: an image from a
registry that does not exist fails as on a cluster (ErrImagePull, ImagePullBackOff, the kubelet's
Events and `kubectl logs` message), real public images and those the demo was told about
(`--image`) run."""

from __future__ import annotations

from pathlib import Path

from demo_served import run_kubectl, serve_demo
from kubesim_helpers import needs_kubectl
from typer.testing import CliRunner
from waiting import eventually

from gpu_operator.cli import app
from gpudemo import fleet

pytestmark = needs_kubectl
FAKE = "images.my-company.example/app:v4"


async def test_kubectl_run_on_the_demo_pulls_only_images_that_exist(tmp_path: Path) -> None:
    async with serve_demo(
        tmp_path, fleet.NAMED["small"], images=["registry.example.com/team/*"]
    ) as (_sim, _nodes, kubeconfig):

        async def kubectl(*args: str) -> str:
            code, out = await run_kubectl(kubeconfig, *args)
            assert code == 0, out
            return out

        await kubectl("run", "fake", f"--image={FAKE}")
        await kubectl("run", "mirrored", "--image=registry.example.com/team/app:1")
        await kubectl("run", "cuda", "--image=nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04")

        async def showing(name: str, *wanted: str) -> bool:
            return (await kubectl("get", "pod", name, "--no-headers")).split()[2] in wanted

        await eventually(lambda: showing("fake", "ErrImagePull", "ImagePullBackOff"), "failing")
        for name in ("mirrored", "cuda"):
            await eventually(lambda name=name: showing(name, "Running"), f"pod {name} running")
        described = await kubectl("describe", "pod", "fake")
        assert (
            f'Failed to pull image "{FAKE}": failed to pull and unpack image "{FAKE}": failed '
            'to resolve image: failed to do request: Head "https://images.my-company.example/'
            'v2/app/manifests/v4": dial tcp: lookup images.my-company.example on 127.0.0.53:53: '
            "no such host"
        ) in described
        assert "Error: ErrImagePull" in described
        await eventually(lambda: showing("fake", "ImagePullBackOff"), "ImagePullBackOff")
        described = await kubectl("describe", "pod", "fake")
        assert f'Back-off pulling image "{FAKE}"' in described
        code, out = await run_kubectl(kubeconfig, "logs", "fake")
        assert code == 1
        assert out.strip() in (
            'Error from server (BadRequest): container "fake" in pod "fake" is waiting to start: '
            f"{why}"
            for why in ("trying and failing to pull image", "image can't be pulled")
        )


def test_the_demo_refuses_an_image_pattern_it_cannot_read() -> None:
    result = CliRunner().invoke(app, ["demo", "--image", "registry.example.com/Team/*:"])
    assert result.exit_code == 2
    assert "error: --image: image pattern 'registry.example.com/Team/*:'" in result.output
