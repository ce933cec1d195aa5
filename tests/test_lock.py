"""The set-up installs exactly the lock: what a fresh clone gets is what CI and the image got."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
DEV_LOCK = ROOT / "requirements-dev.lock"
RUNTIME_LOCK = ROOT / "requirements.lock"
CHECK = ROOT / "scripts" / "venv_lock.py"


def _venv_lock() -> ModuleType:
    spec = importlib.util.spec_from_file_location("venv_lock", CHECK)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _requirement_names(requirements: list[str]) -> set[str]:
    check = _venv_lock()
    return {check.normalize(re.split(r"[\s<>=!~;\[]", req, maxsplit=1)[0]) for req in requirements}


def test_the_venv_holds_exactly_the_dev_lock() -> None:
    # pip freeze of the set-up venv equals the lock: no missing, extra or other-version package.
    proc = subprocess.run(
        [sys.executable, str(CHECK)], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    pins = _venv_lock().read_lock(DEV_LOCK)
    assert {"pytest", "pytest-xdist", "ruff", "mypy", "import-linter", "pip", "setuptools"} <= set(
        pins
    )


def test_the_check_names_every_difference(tmp_path: Path) -> None:
    check = _venv_lock()
    present = check.installed()
    name = "pyyaml"
    lock = DEV_LOCK.read_text()
    version = check.read_lock(DEV_LOCK)[name][0]
    assert present[name] == version
    # The lock pins another PyYAML, forgets pytest and adds a package that is not installed.
    changed = re.sub(rf"(?mi)^pyyaml=={re.escape(version)}", "pyyaml==6.0.0", lock)
    changed = re.sub(r"(?m)^pytest==\S+", "", changed)
    changed += "not-a-real-package==1.0 \\\n    --hash=sha256:" + "0" * 64 + "\n"
    fake = tmp_path / "requirements-dev.lock"
    fake.write_text(changed)
    proc = subprocess.run(
        [sys.executable, str(CHECK), "--lock", str(fake)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 1
    lines = proc.stderr.splitlines()
    assert "requirements-dev.lock: missing: not-a-real-package==1.0" in lines
    assert f"requirements-dev.lock: extra: pytest=={present['pytest']}" in lines
    assert (
        f"requirements-dev.lock: other version: pyyaml is {version}, the lock pins 6.0.0" in lines
    )


def test_the_runtime_lock_is_the_dev_lock_cut_down() -> None:
    check = _venv_lock()
    dev = check.read_lock(DEV_LOCK)
    runtime = check.read_lock(RUNTIME_LOCK)
    assert runtime
    for name, (version, hashes) in runtime.items():
        assert name in dev, f"{name} is in requirements.lock but not in requirements-dev.lock"
        assert dev[name] == (version, hashes), f"{name} is pinned differently in the two locks"
        assert hashes, f"{name} has no hash in requirements.lock"
    assert all(hashes for _, hashes in dev.values())
    # The image gets no test or lint tool.
    assert not {"pytest", "ruff", "mypy", "pip-tools", "hypothesis"} & set(runtime)


def test_every_declared_dependency_is_pinned() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    runtime = _requirement_names(project["dependencies"])
    dev = _requirement_names(project["optional-dependencies"]["dev"])
    build = _requirement_names(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    )
    check = _venv_lock()
    assert runtime - set(check.read_lock(RUNTIME_LOCK)) == set()
    assert (runtime | dev | build) - set(check.read_lock(DEV_LOCK)) == set()


def test_the_image_and_the_set_up_install_from_the_locks_with_hashes() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    commands = [
        command
        for line in dockerfile.replace("\\\n", " ").splitlines()
        for command in line.split("&&")
        if "requirements.lock" in command and " -r " in command
    ]
    assert len(commands) == 2  # the wheels are built, then installed, from the lock
    assert all("--require-hashes" in command for command in commands)
    setup = (ROOT / "scripts" / "setup").read_text()
    assert "--require-hashes" in setup
    assert "-r requirements-dev.lock" in setup
    assert "--no-deps" in setup
    assert "pip install --quiet -e" not in setup  # the project never resolves its own deps
