"""Follow NVIDIA's GPU Operator releases (docs/upstream-releases.md).

    upstream_release.py compare --git DIR --tag v26.7.0   # what a release changed, against ours
    upstream_release.py compare --values FILE [--crds DIR]
    upstream_release.py sync                              # write the facts file into the chart

`compare` reads an upstream release (a git checkout or bare clone of NVIDIA/gpu-operator, or its
values file and CRDs) and prints: values keys it has that our chart lacks (and ours it lacks), the
ClusterPolicy/NVIDIADriver spec fields likewise, and its image defaults next to our facts file
(src/gpu_operator/api/upstream_release.yaml) as a ready `images:` block to review. `sync` writes
the facts file's images into charts/gpu-operator/values.yaml and examples/clusterpolicy-default.yaml
and the release line into Chart.yaml, editing only those lines (comments and layout are kept).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
VALUES = ROOT / "charts" / "gpu-operator" / "values.yaml"
CHART = ROOT / "charts" / "gpu-operator" / "Chart.yaml"
CRDS = ROOT / "charts" / "gpu-operator" / "crds"
EXAMPLE = ROOT / "examples" / "clusterpolicy-default.yaml"
CRD_FILES = (
    "nvidia.com_clusterpolicies.yaml",
    "nvidia.com_gpuclusters.yaml",
    "nvidia.com_nvidiadrivers.yaml",
)
IMAGE_KEYS = ("repository", "image", "version")
_KEY_LINE = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z0-9_.-]+):(?P<rest>.*)$")
_COMPAT = re.compile(r'(values-compatible-with: )"NVIDIA gpu-operator [^"]*"')

sys.path.insert(0, str(ROOT / "src"))
from gpu_operator.api import upstream_release  # noqa: E402

# --- reading ------------------------------------------------------------------------------------


def key_paths(doc: Any, prefix: str = "") -> set[str]:
    """Every mapping key path of a values document (`driver.manager.version`)."""
    paths: set[str] = set()
    if isinstance(doc, Mapping):
        for key, value in doc.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            paths.add(path)
            paths |= key_paths(value, path)
    return paths


def schema_paths(schema: Mapping[str, Any], prefix: str) -> set[str]:
    """Every property path of an OpenAPI schema (`spec.driver.upgradePolicy.drain.enable`)."""
    paths: set[str] = set()
    for key, sub in (schema.get("properties") or {}).items():
        path = f"{prefix}.{key}"
        paths.add(path)
        paths |= schema_paths(sub, path)
    if isinstance(schema.get("items"), Mapping):
        paths |= schema_paths(schema["items"], prefix + "[]")
    return paths


def crd_spec_paths(text: str) -> set[str]:
    crd = yaml.safe_load(text)
    version = next(v for v in crd["spec"]["versions"] if v.get("storage"))
    kind = crd["spec"]["names"]["kind"]
    return schema_paths(version["schema"]["openAPIV3Schema"]["properties"]["spec"], kind)


def image_sections(values: Any, prefix: str = "") -> dict[str, dict[str, str]]:
    """Values sections that pin an image (all three of repository, image and version)."""
    found: dict[str, dict[str, str]] = {}
    if not isinstance(values, Mapping):
        return found
    if all(k in values for k in IMAGE_KEYS) and all(values[k] for k in ("image", "version")):
        found[prefix] = {k: str(values[k]) for k in IMAGE_KEYS}
    for key, value in values.items():
        found |= image_sections(value, f"{prefix}.{key}" if prefix else str(key))
    return found


def git_show(git_dir: str, tag: str, path: str) -> str:
    return subprocess.run(
        ["git", "-C", git_dir, "show", f"{tag}:{path}"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout


# --- compare ------------------------------------------------------------------------------------


def _print_set(title: str, items: set[str]) -> None:
    print(f"{title} ({len(items)}):")
    for item in sorted(items):
        print(f"  {item}")


def compare(upstream_values: str, upstream_crds: Mapping[str, str]) -> int:
    theirs, ours = yaml.safe_load(upstream_values), yaml.safe_load(VALUES.read_text())
    _print_set("values keys only upstream has (add them)", key_paths(theirs) - key_paths(ours))
    _print_set(
        "values keys only ours has (ours, or removed upstream)", key_paths(ours) - key_paths(theirs)
    )
    for name, text in upstream_crds.items():
        mine = crd_spec_paths((CRDS / name).read_text())
        other = crd_spec_paths(text)
        _print_set(f"{name}: spec fields only upstream has", other - mine)
        _print_set(f"{name}: spec fields only ours has", mine - other)
    facts = upstream_release.current()
    print(f"image defaults (ours follow {facts.tag}); differences marked *:")
    print("images:")
    for path, image in sorted(image_sections(theirs).items()):
        pinned = facts.images.get(path)
        ref = "{repository}/{image}:{version}".format(**image)
        mark = "" if pinned and pinned.ref == ref else "  # *"
        print(
            f"  {path}: {{repository: {image['repository']}, image: {image['image']}, "
            f"version: {_scalar(image['version'], '')}}}{mark}"
        )
    for path in sorted(set(facts.images) - set(image_sections(theirs))):
        print(f"  # {path}: pinned by ours only (upstream uses its appVersion or dropped it)")
    return 0


# --- sync ---------------------------------------------------------------------------------------


def _walk(lines: list[str]) -> Iterator[tuple[int, str, str]]:
    """(line index, dotted key path, key) for each `key: value` line of a block-style YAML file.
    List items and block scalars end up under paths no section has, which is all we need."""
    stack: list[tuple[int, str]] = []
    for index, line in enumerate(lines):
        found = _KEY_LINE.match(line)
        if not found or line.lstrip().startswith("#"):
            continue
        indent = len(found["indent"])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = ".".join([k for _, k in stack] + [found["key"]])
        yield index, path, found["key"]
        stack.append((indent, found["key"]))


def _scalar(value: str, old: str) -> str:
    """The value as a YAML scalar, quoted where the old one was or where YAML would not read it
    back as this string (`2.29` would be a number)."""
    quoted = old.strip().startswith(('"', "'")) or yaml.safe_load(value) != value
    return f'"{value}"' if quoted else value


def rewrite_images(
    text: str, images: Mapping[str, upstream_release.Image], prefix: str = ""
) -> str:
    lines = text.splitlines(keepends=True)
    for index, path, key in list(_walk(lines)):
        section = path.rsplit(".", 1)[0]
        if key not in IMAGE_KEYS or not section.startswith(prefix):
            continue
        image = images.get(section[len(prefix) :])
        if image is None:
            continue
        found = _KEY_LINE.match(lines[index])
        assert found is not None
        comment = re.search(r"\s+#.*$", found["rest"])
        tail = comment.group(0) if comment else ""
        old = found["rest"][: comment.start()] if comment else found["rest"]
        lines[index] = f"{found['indent']}{key}: {_scalar(getattr(image, key), old)}{tail}\n"
    return "".join(lines)


def sync() -> int:
    facts = upstream_release.current()
    VALUES.write_text(rewrite_images(VALUES.read_text(), facts.images))
    EXAMPLE.write_text(rewrite_images(EXAMPLE.read_text(), facts.images, prefix="spec."))
    CHART.write_text(_COMPAT.sub(rf'\1"NVIDIA gpu-operator {facts.line}"', CHART.read_text()))
    values = yaml.safe_load(VALUES.read_text())
    wrong = [
        p
        for p, i in facts.images.items()
        if image_sections(values).get(p) != {k: getattr(i, k) for k in IMAGE_KEYS}
    ]
    if wrong:
        print(
            f"values.yaml has no complete image section for: {', '.join(wrong)} (add them by hand)"
        )
        return 1
    print(
        f"synced {len(facts.images)} images of {facts.tag} into {VALUES.relative_to(ROOT)}, "
        f"{EXAMPLE.relative_to(ROOT)} and {CHART.relative_to(ROOT)}"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    cmp = sub.add_parser("compare", help="compare an upstream release with ours")
    cmp.add_argument("--git", help="NVIDIA/gpu-operator git directory (a bare clone works)")
    cmp.add_argument("--tag", help="release tag with --git, e.g. v26.7.0")
    cmp.add_argument("--values", type=Path, help="upstream values.yaml (instead of --git)")
    cmp.add_argument("--crds", type=Path, help="directory with upstream CRDs (with --values)")
    sub.add_parser("sync", help="write the facts file's images into the chart and examples")
    args = parser.parse_args(argv)
    if args.command == "sync":
        return sync()
    if args.git:
        if not args.tag:
            parser.error("--git needs --tag")
        base = "deployments/gpu-operator"
        return compare(
            git_show(args.git, args.tag, f"{base}/values.yaml"),
            {n: git_show(args.git, args.tag, f"{base}/crds/{n}") for n in CRD_FILES},
        )
    if not args.values:
        parser.error("give --git DIR --tag TAG, or --values FILE")
    folder = args.crds
    crds = {n: (folder / n).read_text() for n in CRD_FILES if folder and (folder / n).exists()}
    return compare(args.values.read_text(), crds)


if __name__ == "__main__":
    sys.exit(main())
