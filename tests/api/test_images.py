"""Image resolution per reference §1.3."""

from __future__ import annotations

import pytest

from gpu_operator.api import images
from gpu_operator.api.core_types import ImageSpec

ENV = {"DEVICE_PLUGIN_IMAGE": "nvcr.io/nvidia/k8s-device-plugin:v0.18.0"}


@pytest.mark.parametrize(
    ("repository", "image", "version", "expected"),
    [
        ("nvcr.io/nvidia", "driver", "580.95.05", "nvcr.io/nvidia/driver:580.95.05"),
        ("nvcr.io/nvidia", "driver", "sha256:abcd", "nvcr.io/nvidia/driver@sha256:abcd"),
        (None, "registry.local/driver@sha256:ff", None, "registry.local/driver@sha256:ff"),
        ("", "registry.local/plugin:v1", "", "registry.local/plugin:v1"),
    ],
)
def test_image_from_the_cr(
    repository: str | None, image: str | None, version: str | None, expected: str
) -> None:
    assert images.image_path(repository, image, version, env_name="X", environ={}) == expected


def test_falls_back_to_operator_env() -> None:
    assert images.resolve(None, "devicePlugin", ENV) == ENV["DEVICE_PLUGIN_IMAGE"]
    assert images.resolve(ImageSpec(), "devicePlugin", ENV) == ENV["DEVICE_PLUGIN_IMAGE"]


def test_incomplete_reference_names_what_is_missing() -> None:
    with pytest.raises(images.ImageError, match=r"spec.driver: version not set"):
        images.resolve(ImageSpec(repository="nvcr.io/nvidia", image="driver"), "driver", {})


def test_nothing_anywhere_names_the_env_var() -> None:
    with pytest.raises(images.ImageError, match="GFD_IMAGE is empty"):
        images.resolve(None, "gfd", {})


@pytest.mark.parametrize(
    ("value", "expected"),
    [("Always", "Always"), ("Never", "Never"), ("IfNotPresent", "IfNotPresent"),
     ("always", "IfNotPresent"), (None, "IfNotPresent")],
)  # fmt: skip
def test_pull_policy(value: str | None, expected: str) -> None:
    assert images.pull_policy(value) == expected


@pytest.mark.parametrize(
    ("os_id", "version", "tag"),
    [("ubuntu", "22.04", "ubuntu22.04"), ("rhel", "9.4", "rhel9"), ("rocky", "8.10", "rocky8"),
     ("ol", "9.2", "ol9"), ("sles", "15.5", "sles15.5"), ("rhcos", "4.16", "rhcos4.16")],
)  # fmt: skip
def test_os_tag(os_id: str, version: str, tag: str) -> None:
    assert images.os_tag(os_id, version) == tag


def test_driver_tags() -> None:
    path = "nvcr.io/nvidia/driver:580.95.05"
    assert images.driver_image(path, "ubuntu22.04") == f"{path}-ubuntu22.04"
    assert images.driver_image("r/driver@sha256:1", "ubuntu22.04") == "r/driver@sha256:1"
    assert (
        images.precompiled_driver_image("r/driver:580", "6.8.0-45-generic", "ubuntu24.04")
        == "r/driver:580-6.8.0-45-generic-ubuntu24.04"
    )
