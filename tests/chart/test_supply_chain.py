"""Supply chain of the operator image: the base image pinned by digest, and every dependency
installed from requirements.lock with its hashes (pip --require-hashes)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from .test_dockerfile import ROOT, base_images, instructions

LOCK = ROOT / "requirements.lock"


def _pins() -> dict[str, tuple[str, list[str]]]:
    """name -> (version, hashes) from the lock file."""
    text = re.sub(r"\\\n", " ", LOCK.read_text())
    pins = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        spec, *options = line.split()
        name, _, version = spec.partition("==")
        hashes = [o.split("=", 1)[1] for o in options if o.startswith("--hash=")]
        pins[canonicalize_name(name)] = (version, hashes)
    return pins


def test_every_base_image_is_pinned_by_digest() -> None:
    for image in base_images():
        assert re.search(r"@sha256:[0-9a-f]{64}$", image), f"{image}: not pinned by digest"


def test_every_locked_package_is_pinned_with_hashes() -> None:
    pins = _pins()
    assert pins
    for name, (version, hashes) in pins.items():
        assert re.fullmatch(r"[0-9][0-9A-Za-z.+!-]*", version), f"{name}: not pinned with =="
        assert hashes, f"{name}: no hashes"
        assert all(h.startswith("sha256:") for h in hashes), f"{name}: {hashes}"


def test_the_lock_satisfies_every_project_dependency() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = _pins()
    for text in project["dependencies"]:
        requirement = Requirement(text)
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{requirement.name} is not in requirements.lock"
        assert requirement.specifier.contains(pins[name][0], prereleases=True), (
            f"requirements.lock pins {name}=={pins[name][0]}, pyproject wants {requirement}"
        )


def test_the_image_installs_dependencies_only_from_the_lock_with_hashes() -> None:
    runs = instructions("RUN")
    assert any("--require-hashes" in r and "-r requirements.lock" in r for r in runs)
    (install,) = [r for r in runs if "pip install" in r]
    assert "--no-index --find-links=/wheels --require-hashes -r /wheels/requirements.lock" in (
        re.sub(r"\s+", " ", install)
    )
    # The project itself goes in without resolving dependencies again (they are all locked).
    assert re.search(r"--no-deps [^&]*gpu-operator-py", install)
    ignored = (ROOT / ".dockerignore").read_text().splitlines()
    assert "!requirements.lock" in ignored
    assert Path(LOCK).is_file()
