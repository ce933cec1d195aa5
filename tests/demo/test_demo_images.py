"""Every image the chart, its examples and the demo pull exists in kubesim's default registries
(so the demo and `helm install` on kubesim pull them, while made-up images fail as on a cluster);
an image an example says users build and push themselves stays unknown."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpu_operator import __version__
from gpu_operator.api import upstream_release
from gpu_operator.cli import app, render
from gpudemo import install
from kubesim import ImageCatalog
from simhost import nfd, runtime_boot

ROOT = Path(__file__).resolve().parents[2]
VALUES = ROOT / "charts" / "gpu-operator" / "values.yaml"
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
# Repositories examples name that nobody publishes: the vGPU manager is built from NVIDIA's
# licensed host driver and pushed to the user's own registry (examples/kubevirt-vgpu.yaml).
PRIVATE = ("registry.example.com/",)
runner = CliRunner()


def _images(*args: str) -> list[str]:
    result = runner.invoke(app, ["images", *args])
    assert result.exit_code == 0, result.output
    return result.stdout.splitlines()


@pytest.mark.parametrize(
    "source",
    [("--values", str(VALUES)), *(("-f", str(example)) for example in EXAMPLES)],
    ids=lambda source: Path(source[1]).name,
)
def test_every_image_the_chart_and_the_examples_pull_exists_on_kubesim(
    source: tuple[str, str],
) -> None:
    catalog = ImageCatalog()
    listed = _images(*source)
    assert listed
    for image in listed:
        failure = catalog.pull(image)
        if image.startswith(PRIVATE):
            assert failure is not None, image
        else:
            assert failure is None, failure.message


def test_the_demos_own_images_exist_on_kubesim() -> None:
    catalog = ImageCatalog()
    release = upstream_release.current()
    used = {
        f"{install.OPERATOR_IMAGE}:{__version__}",
        f"{nfd.IMAGE}:{release.nfd}",
        runtime_boot.SANDBOX_IMAGE,
        *render.DEFAULT_OPERATOR_ENV.values(),
        *(v for k, v in render.CHART_OPERATOR_ENV.items() if k.endswith("_IMAGE")),
        *(image.ref for image in release.images.values()),
    }
    missing = {image: failure.message for image in used if (failure := catalog.pull(image))}
    assert not missing
