"""`gpu-operator images`: the images to mirror before an air-gapped install (text or JSON)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from enum import StrEnum
from pathlib import Path
from typing import Any

import typer
import yaml
from rich.console import Console

from gpu_operator.api import manifests
from gpu_operator.cli import image_list, render

err = Console(stderr=True, highlight=False, soft_wrap=True)
ROOT = Path(__file__).resolve().parents[3]  # the checkout (src/gpu_operator/cli/images.py)


class ImagesFormat(StrEnum):
    text = "text"
    json = "json"


class ChartError(RuntimeError):
    """helm or the chart could not produce the objects."""


def find_helm() -> str:
    """$HELM, the checkout's .tools/bin/helm, or helm on PATH."""
    for candidate in (os.environ.get("HELM"), str(ROOT / ".tools" / "bin" / "helm")):
        if candidate and Path(candidate).is_file():
            return candidate
    found = shutil.which("helm")
    if found:
        return found
    raise ChartError("helm not found (needed for --values): run scripts/setup or set $HELM")


def find_chart() -> Path:
    for base in (ROOT, Path.cwd()):
        chart = base / "charts" / "gpu-operator"
        if (chart / "Chart.yaml").is_file():
            return chart
    raise ChartError("charts/gpu-operator not found: pass --chart")


def chart_objects(chart: Path, values: list[Path], namespace: str) -> list[dict[str, Any]]:
    """`helm template` of the chart with these values files (hooks and subcharts included)."""
    # Offline, helm knows no API the target cluster serves: the chart's GPUCluster check wants
    # resource.k8s.io (the Kubernetes 1.35 of the default facts serves it; render_cluster checks
    # the facts' version).
    args = [find_helm(), "template", "gpu-operator", str(chart), "--namespace", namespace,
            "--api-versions", "resource.k8s.io/v1/DeviceClass"]  # fmt: skip
    for path in values:
        if not path.is_file():
            raise ChartError(f"--values {path}: no such file")
        args += ["--values", str(path)]
    try:
        proc = subprocess.run(args, capture_output=True, text=True, timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ChartError(f"helm template failed: {exc}") from None
    if proc.returncode != 0:
        raise ChartError(f"helm template {chart}: {proc.stderr.strip()}")
    return [d for d in yaml.safe_load_all(proc.stdout) if isinstance(d, dict)]


def images_command(
    filenames: list[str] = typer.Option(
        [],
        "-f",
        "--filename",
        help="ClusterPolicy file (with NVIDIADrivers, ConfigMaps; repeatable); - is stdin.",
    ),
    values: list[Path] = typer.Option(
        [], "--values", help="Chart values file (repeatable): list what `helm install` would pull."
    ),
    chart: Path | None = typer.Option(
        None, "--chart", help="Chart directory for --values (default: charts/gpu-operator)."
    ),
    facts: Path | None = typer.Option(
        None, "--facts", help="Cluster facts YAML: pools' OS and kernels (precompiled driver tags)."
    ),
    namespace: str = typer.Option("gpu-operator", "--namespace", help="Operator namespace."),
    output: ImagesFormat = typer.Option(
        ImagesFormat.text, "-o", "--output", help="text (one per line) or json."
    ),
) -> None:
    """Every image the policy or the chart would pull, deduplicated and sorted (for mirroring)."""
    if bool(filenames) == bool(values or chart is not None):
        err.print("error: give either -f POLICY or --values FILE (or --chart DIR)")
        raise typer.Exit(2)
    try:
        facts_file = render.load_facts(facts) if facts is not None else render.parse_facts({})
        if filenames:
            labels = ["<stdin>" if filename == "-" else filename for filename in filenames]
            documents = [doc for filename in filenames for doc in manifests.read(filename)]
            listed = image_list.from_documents(
                documents, facts_file, label=", ".join(dict.fromkeys(labels)), namespace=namespace
            )
        else:
            objects = chart_objects(chart or find_chart(), values, namespace)
            env = {**image_list.operator_env(objects), **facts_file.operator_env}
            facts_file = facts_file.model_copy(update={"operator_env": env})
            # The chart names its own operator image (its Deployment and hook Jobs).
            listed = image_list.from_documents(
                objects, facts_file, label="chart", operator_image=None, namespace=namespace
            )
    except (
        manifests.ManifestError,
        render.FactsError,
        image_list.ImageListError,
        ChartError,
    ) as exc:
        err.print(f"error: {exc}", markup=False)
        raise typer.Exit(2 if not isinstance(exc, image_list.ImageListError) else 1) from None
    for warning in listed.warnings:
        err.print(f"warning: {warning}", markup=False)
    if output is ImagesFormat.json:
        typer.echo(json.dumps(listed.to_json(), indent=2))
    else:
        for image in listed.images:
            typer.echo(image)
