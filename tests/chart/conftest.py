"""Rendering the chart with the real helm binary (skipped, with the reason, when it is absent)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "gpu-operator"
HELM = ROOT / ".tools" / "bin" / "helm"
KUBECTL = ROOT / ".tools" / "bin" / "kubectl"
NAMESPACE = "gpu-operator"

needs_helm = pytest.mark.skipif(
    not HELM.exists(), reason="helm not installed: run scripts/setup (scripts/install_tools.py)"
)


@dataclass
class Rendered:
    """The output of one `helm template` run."""

    returncode: int
    stdout: str
    stderr: str

    @property
    def objects(self) -> list[dict[str, Any]]:
        assert self.returncode == 0, self.stderr
        return [d for d in yaml.safe_load_all(self.stdout) if d]

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [o for o in self.objects if o["kind"] == kind]

    def one(self, kind: str, name: str | None = None) -> dict[str, Any]:
        found = [o for o in self.of_kind(kind) if name is None or o["metadata"]["name"] == name]
        assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
        return found[0]


def helm(
    *args: str, check: bool = False, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, **env} if env else None
    proc = subprocess.run(
        [str(HELM), *args], capture_output=True, text=True, timeout=60, env=full_env
    )
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


@pytest.fixture(scope="session")
def packaged_chart(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The chart as a release ships it: `helm package` of the checkout (NFD included)."""
    if not HELM.exists():
        pytest.skip("helm not installed: run scripts/setup (scripts/install_tools.py)")
    target = tmp_path_factory.mktemp("chart")
    helm("package", str(CHART), "-d", str(target), check=True)
    (archive,) = target.glob("gpu-operator-*.tgz")
    return archive


@pytest.fixture(scope="session")
def render(packaged_chart: Path) -> Any:
    def run(values: Sequence[str | Path] = (), sets: Sequence[str] = (), *extra: str) -> Rendered:
        args = ["template", "gpu-operator", str(packaged_chart), "-n", NAMESPACE]
        for file in values:
            args += ["-f", str(file)]
        for item in sets:
            args += ["--set", item]
        proc = helm(*args, *extra)
        return Rendered(proc.returncode, proc.stdout, proc.stderr)

    return run
