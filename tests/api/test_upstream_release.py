"""The NVIDIA release we follow (api/upstream_release.yaml) is what the chart, the operator's image
fallbacks, the examples and `gpu-operator images` use, and scripts/upstream_release.py keeps them
so: a release bump is one edit of the facts file plus `scripts/upstream-release sync`."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml
from typer.testing import CliRunner

from gpu_operator.api import upstream_release
from gpu_operator.cli import app, render

ROOT = Path(__file__).resolve().parents[2]
VALUES = ROOT / "charts" / "gpu-operator" / "values.yaml"
RELEASE = upstream_release.current()


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "upstream_release_script", ROOT / "scripts" / "upstream_release.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


SCRIPT = _script()


def _triple(image: upstream_release.Image) -> dict[str, str]:
    return {"repository": image.repository, "image": image.image, "version": image.version}


def test_the_facts_name_a_released_26_7_set() -> None:
    assert RELEASE.tag == "v26.7.0"
    assert RELEASE.line == "v26.x"
    assert RELEASE.images["validator"].ref == "nvcr.io/nvidia/gpu-operator:v26.7.0"
    assert RELEASE.images["driver"].version == "595.91.07"


def test_chart_values_pin_exactly_the_release_images() -> None:
    pinned = SCRIPT.image_sections(yaml.safe_load(VALUES.read_text()))
    # Our own operator image and the licensed vGPU manager (no default) pin no version.
    assert set(pinned) == set(RELEASE.images)
    for path, image in RELEASE.images.items():
        assert pinned[path] == _triple(image), path


def test_operator_fallbacks_are_the_release_images() -> None:
    for name, ref in RELEASE.operator_env().items():
        assert render.DEFAULT_OPERATOR_ENV[name] == ref, name
    # Nothing older than the release survives among the fallbacks (CUDA_BASE_IMAGE is ours).
    assert set(render.DEFAULT_OPERATOR_ENV) - set(RELEASE.operator_env()) == {"CUDA_BASE_IMAGE"}


def test_default_example_pins_the_release_images() -> None:
    spec = yaml.safe_load((ROOT / "examples" / "clusterpolicy-default.yaml").read_text())
    pinned = SCRIPT.image_sections(spec["spec"])
    assert pinned, "the example pins no image"
    for path, triple in pinned.items():
        assert triple == _triple(RELEASE.images[path]), path


def test_chart_says_which_release_line_its_values_follow() -> None:
    chart = yaml.safe_load((ROOT / "charts" / "gpu-operator" / "Chart.yaml").read_text())
    annotation = chart["annotations"]["gpu-operator.nvidia.com/values-compatible-with"]
    assert annotation == f"NVIDIA gpu-operator {RELEASE.line}"
    nfd = yaml.safe_load(
        (
            ROOT / "charts" / "gpu-operator" / "charts" / "node-feature-discovery" / "Chart.yaml"
        ).read_text()
    )
    assert f"v{nfd['version']}" == RELEASE.nfd
    assert RELEASE.line in (ROOT / "README.md").read_text()


def test_air_gap_list_of_chart_defaults_has_only_release_tags() -> None:
    result = CliRunner().invoke(app, ["images", "--chart", str(ROOT / "charts" / "gpu-operator")])
    assert result.exit_code == 0, result.output
    listed = result.stdout.split()
    assert "nvcr.io/nvidia/gpu-operator:v26.7.0" in listed
    refs = {i.ref for i in RELEASE.images.values()}
    for image in listed:
        if image.startswith("nvcr.io/"):
            # The driver image carries the node OS: <version>-ubuntu22.04.
            assert image in refs or any(image.startswith(r + "-") for r in refs), image
    assert f"registry.k8s.io/nfd/node-feature-discovery:{RELEASE.nfd}" in listed


def test_sync_is_a_no_op_on_files_in_step_with_the_facts() -> None:
    for path, prefix in ((VALUES, ""), (ROOT / "examples" / "clusterpolicy-default.yaml", "spec.")):
        text = path.read_text()
        assert SCRIPT.rewrite_images(text, RELEASE.images, prefix=prefix) == text, path.name


def test_sync_rewrites_only_the_pinned_lines_keeping_quotes_and_comments() -> None:
    text = (
        "driver:\n"
        "  enabled: true\n"
        "  repository: nvcr.io/nvidia  # keep me\n"
        "  image: driver\n"
        '  version: "580.95.05"\n'
        "  manager:\n"
        "    image: k8s-driver-manager\n"
        "    repository: nvcr.io/nvidia/cloud-native\n"
        "    version: v0.9.0\n"
        "  env:\n"
        "    - name: version\n"
        "      version: untouched\n"
        "gds:\n"
        "  version: 2.26.6\n"
    )
    images = {
        "driver": upstream_release.Image("nvcr.io/nvidia", "driver", "600.1.2"),
        "driver.manager": upstream_release.Image(
            "nvcr.io/nvidia/cloud-native", "k8s-driver-manager", "v0.13.0"
        ),
        "gds": upstream_release.Image("nvcr.io/nvidia/cloud-native", "nvidia-fs", "2.30"),
    }
    out = SCRIPT.rewrite_images(text, images)
    assert "  repository: nvcr.io/nvidia  # keep me\n" in out
    assert '  version: "600.1.2"\n' in out
    assert "    version: v0.13.0\n" in out
    assert "      version: untouched\n" in out
    # 2.30 would read back as a number: quoted.
    assert '  version: "2.30"\n' in out
    assert yaml.safe_load(out)["gds"]["version"] == "2.30"


def test_compare_lists_new_keys_and_marks_changed_images(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    theirs = yaml.safe_load(VALUES.read_text())
    theirs["toolkit"]["version"] = "v9.9.9"
    theirs["toolkit"]["brandNewKey"] = True
    (tmp_path / "values.yaml").write_text(yaml.safe_dump(theirs))
    assert SCRIPT.main(["compare", "--values", str(tmp_path / "values.yaml")]) == 0
    out = capsys.readouterr().out
    assert "  toolkit.brandNewKey\n" in out
    toolkit = next(line for line in out.splitlines() if line.startswith("  toolkit:"))
    assert "v9.9.9" in toolkit
    assert toolkit.endswith("# *")
    driver = next(line for line in out.splitlines() if line.startswith("  driver:"))
    assert not driver.endswith("# *")


def test_malformed_facts_name_what_is_missing() -> None:
    with pytest.raises(KeyError, match="images"):
        upstream_release.parse({"release": "v1.0.0", "supported": "1.0.x", "nfd": "v0.1.0"})
