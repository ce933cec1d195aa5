"""scripts/build-image makes a source change reach the image: podman/buildah 1.28 keys a cached RUN
on its text and the stage's build arguments only, not on what it bind-mounts from the build stage,
so the runtime stage's install step declares `ARG SOURCE_DIGEST` and build-image passes a digest
of the build context's files. Fast: no image is built (podman is a recording stand-in here)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUILD_IMAGE = ROOT / "scripts" / "build-image"


def source_digest(tree: Path) -> str:
    done = subprocess.run(
        [str(BUILD_IMAGE), "--source-digest", str(tree)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    digest = done.stdout.strip()
    assert re.fullmatch(r"[0-9a-f]{64}", digest), done.stdout
    return digest


def make_tree(tree: Path) -> None:
    for name in ("pyproject.toml", "requirements.lock", "README.md", "Dockerfile"):
        (tree / name).write_text(f"{name}\n")
    (tree / "src" / "pkg").mkdir(parents=True)
    (tree / "src" / "pkg" / "cli.py").write_text("print('old')\n")


def test_the_digest_follows_every_source_file_and_ignores_bytecode(tmp_path: Path) -> None:
    make_tree(tmp_path)
    first = source_digest(tmp_path)
    assert source_digest(tmp_path) == first

    cache = tmp_path / "src" / "pkg" / "__pycache__"
    cache.mkdir()
    (cache / "cli.cpython-311.pyc").write_bytes(b"\0bytecode")
    (tmp_path / "src" / "pkg" / "stray.pyc").write_bytes(b"\0bytecode")
    assert source_digest(tmp_path) == first, "bytecode is not in the build context"

    seen = {first}
    (tmp_path / "src" / "pkg" / "cli.py").write_text("print('new')\n")
    seen.add(source_digest(tmp_path))
    (tmp_path / "src" / "pkg" / "entrypoints.py").write_text("NAMES = ()\n")
    seen.add(source_digest(tmp_path))
    (tmp_path / "src" / "pkg" / "entrypoints.py").rename(tmp_path / "src" / "pkg" / "points.py")
    seen.add(source_digest(tmp_path))
    for name in ("pyproject.toml", "requirements.lock", "README.md", "Dockerfile"):
        (tmp_path / name).write_text(f"{name} changed\n")
        seen.add(source_digest(tmp_path))
    assert len(seen) == 8, "each of the 7 changes above gives a new digest"


def test_a_tree_that_is_not_a_build_context_is_refused_by_name(tmp_path: Path) -> None:
    make_tree(tmp_path)
    (tmp_path / "requirements.lock").unlink()
    done = subprocess.run(
        [str(BUILD_IMAGE), "--source-digest", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode != 0
    assert done.stdout == ""
    assert "has no requirements.lock" in done.stderr


def test_build_image_passes_the_digest_of_its_tree(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = tmp_path / "podman-args"
    # A stand-in podman: the base "exists", `build` writes its arguments (one a line), `inspect`
    # prints a size. buildah and mmdebstrap only need to be found.
    (bin_dir / "podman").write_text(
        "#!/bin/sh\n"
        'case "$1 $2" in\n'
        '  "image exists") exit 0 ;;\n'
        '  "image inspect") echo 1; exit 0 ;;\n'
        "esac\n"
        f'[ "$1" = build ] && printf "%s\\n" "$@" > "{record}"\n'
        "exit 0\n"
    )
    for tool in ("buildah", "mmdebstrap"):
        (bin_dir / tool).write_text("#!/bin/sh\nexit 0\n")
    for program in bin_dir.iterdir():
        program.chmod(0o755)

    before = source_digest(ROOT)
    done = subprocess.run(
        [str(BUILD_IMAGE)],
        env={
            **os.environ,
            "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
            "IMAGE": "localhost/gpu-operator:unit",
            "PIP_CA_BUNDLE": "",
            "PIP_CERT": "",
        },
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    after = source_digest(ROOT)  # others may edit the tree meanwhile: either one is right
    assert done.returncode == 0, done.stderr
    args = record.read_text().splitlines()
    assert args[0] == "build"
    passed = [args[i + 1] for i, arg in enumerate(args) if arg == "--build-arg"]
    digests = [a.removeprefix("SOURCE_DIGEST=") for a in passed if a.startswith("SOURCE_DIGEST=")]
    assert len(digests) == 1, passed
    assert digests[0] in {before, after}


def instructions(dockerfile: str) -> list[str]:
    """The Dockerfile's instructions, continuation lines joined, comments dropped."""
    joined: list[str] = []
    current = ""
    for line in dockerfile.splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            current += line.rstrip()[:-1] + " "
            continue
        joined.append(current + line)
        current = ""
    return [" ".join(i.split()) for i in joined]


def test_the_runtime_install_step_is_keyed_on_the_digest() -> None:
    steps = instructions((ROOT / "Dockerfile").read_text())
    start = next(i for i, s in enumerate(steps) if re.match(r"FROM \S+ AS runtime$", s))
    install = next(
        i
        for i, s in enumerate(steps)
        if i > start and s.startswith("RUN ") and "from=build" in s and "/wheels" in s
    )
    assert steps[install - 1].split("=")[0] == "ARG SOURCE_DIGEST", steps[install - 1]
    assert re.search(r"\$\{?SOURCE_DIGEST\b", steps[install]), steps[install]
    # Declared in the runtime stage, not only before the first FROM (that would not reach it).
    assert not any(s.startswith("FROM ") for s in steps[start + 1 : install])
