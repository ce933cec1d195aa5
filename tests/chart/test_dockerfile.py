"""The operator image's Dockerfile (no Docker engine here: parse it and check the rules)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Instructions with their continuation lines joined, comments dropped.
LINES = [
    line.strip()
    for line in re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text()).splitlines()
    if line.strip() and not line.strip().startswith("#")
]


def instructions(name: str) -> list[str]:
    return [line.split(None, 1)[1] for line in LINES if line.split(None, 1)[0].upper() == name]


def base_images() -> list[str]:
    args = dict(a.split("=", 1) for a in instructions("ARG") if "=" in a)
    stages = {f.split()[-1] for f in instructions("FROM") if " AS " in f.upper()}
    images = []
    for line in instructions("FROM"):
        ref = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], line.split()[0])
        if ref not in stages:
            images.append(ref)
    return images


def test_it_is_multi_stage_from_pinned_bases() -> None:
    assert len(instructions("FROM")) >= 2
    for image in base_images():
        name, _, tag = image.rpartition(":")
        assert name, f"{image}: no image name"
        assert tag, f"{image}: base image without a tag"
        assert tag != "latest"
        assert re.search(r"\d+\.\d+\.\d+", tag) or "@sha256:" in image, f"{image}: not pinned"
    assert "latest" not in (ROOT / "Dockerfile").read_text()


def test_it_runs_as_a_numeric_non_root_user_matching_the_chart() -> None:
    users = instructions("USER")
    assert users, "no USER: the image would run as root"
    user = users[-1].split(":")[0]
    assert user.isdigit()
    assert int(user) != 0
    chart = (ROOT / "charts" / "gpu-operator" / "templates" / "operator.yaml").read_text()
    assert f"runAsUser: {user}" in chart


def test_one_image_serves_the_controller_and_every_agent() -> None:
    (entrypoint,) = instructions("ENTRYPOINT")
    assert entrypoint == '["gpu-operator"]'
    assert any("pip install" in run and "gpu-operator-py" in run for run in instructions("RUN"))


def test_build_context_is_only_what_the_install_needs() -> None:
    ignored = (ROOT / ".dockerignore").read_text().splitlines()
    assert "*" in ignored
    assert {"!pyproject.toml", "!README.md", "!src/"} <= set(ignored)
