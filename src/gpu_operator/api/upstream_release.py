"""The NVIDIA GPU Operator release whose operand defaults we follow (facts: upstream_release.yaml).

One file names every operand image of that release by the values section that pins it; the chart,
the operator's `*_IMAGE` fallbacks and the examples are checked against it, so following a new
release starts with one edit there (docs/upstream-releases.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib import resources
from types import MappingProxyType
from typing import Any

import yaml

from gpu_operator.api.images import IMAGE_ENV


@dataclass(frozen=True)
class Image:
    """One pinned image: the three values keys a chart section carries."""

    repository: str
    image: str
    version: str

    @property
    def ref(self) -> str:
        return f"{self.repository}/{self.image}:{self.version}"


@dataclass(frozen=True)
class Release:
    """An upstream release: its tag, the line NVIDIA supports, its images and its NFD version."""

    tag: str
    supported: str
    images: MappingProxyType[str, Image]
    nfd: str

    @property
    def line(self) -> str:
        """The release line a values file is compatible with: `v26.x` for v26.7.0."""
        return f"{self.tag.split('.')[0]}.x"

    def operator_env(self) -> dict[str, str]:
        """The operator's `*_IMAGE` fallbacks for this release (first section wins per variable)."""
        env: dict[str, str] = {}
        for path, image in self.images.items():
            name = IMAGE_ENV.get(_env_key(path))
            if name is not None:
                env.setdefault(name, image.ref)
        return env


def _env_key(path: str) -> str:
    """The `IMAGE_ENV` key of a values section: its last part (driver.manager: driverManager)."""
    last = path.rsplit(".", 1)[-1]
    return "driverManager" if last == "manager" else last


def parse(doc: Any) -> Release:
    """A release from the facts file's YAML; KeyError/TypeError name what is malformed."""
    images = {
        str(path): Image(str(v["repository"]), str(v["image"]), str(v["version"]))
        for path, v in doc["images"].items()
    }
    return Release(
        tag=str(doc["release"]),
        supported=str(doc["supported"]),
        images=MappingProxyType(images),
        nfd=str(doc["nfd"]),
    )


@cache
def current() -> Release:
    """The release this build follows."""
    text = resources.files(__package__).joinpath("upstream_release.yaml").read_text()
    return parse(yaml.safe_load(text))
