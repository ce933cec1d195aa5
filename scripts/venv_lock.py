"""Does this interpreter's environment hold exactly what a lock file pins?

    python scripts/venv_lock.py [--lock requirements-dev.lock] [--prune]

Prints one line per difference (missing, extra, other version) and exits 1 when there is any.
With --prune, packages the lock does not list (left by an older lock) are uninstalled first.
The project itself, installed editable by scripts/setup, is not in the lock and not counted.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path

PROJECT = "gpu-operator-py"
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)")
_HASH = re.compile(r"--hash=(\w+:[0-9a-f]+)")


def normalize(name: str) -> str:
    """A distribution name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_lock(path: Path) -> dict[str, tuple[str, frozenset[str]]]:
    """name -> (version, hashes) for each pin of a pip-compile lock."""
    pins: dict[str, tuple[str, frozenset[str]]] = {}
    current = ""
    for line in path.read_text().splitlines():
        match = _PIN.match(line)
        if match:
            current = normalize(match.group(1))
            pins[current] = (match.group(2), frozenset())
        if current and "--hash=" in line:
            version, hashes = pins[current]
            pins[current] = (version, hashes | set(_HASH.findall(line)))
    return pins


def installed() -> dict[str, str]:
    """name -> version of every distribution this interpreter sees, the project excluded."""
    found = {
        normalize(dist.metadata["Name"]): dist.version
        for dist in importlib.metadata.distributions()
    }
    found.pop(PROJECT, None)
    return found


def differences(pins: dict[str, str], present: dict[str, str]) -> list[str]:
    out = [f"missing: {name}=={pins[name]}" for name in sorted(pins.keys() - present.keys())]
    out += [f"extra: {name}=={present[name]}" for name in sorted(present.keys() - pins.keys())]
    out += [
        f"other version: {name} is {present[name]}, the lock pins {pins[name]}"
        for name in sorted(pins.keys() & present.keys())
        if present[name] != pins[name]
    ]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    root = Path(__file__).resolve().parent.parent
    parser.add_argument("--lock", type=Path, default=root / "requirements-dev.lock")
    parser.add_argument("--prune", action="store_true", help="uninstall what the lock omits")
    args = parser.parse_args(argv)
    pins = {name: version for name, (version, _) in read_lock(args.lock).items()}
    extra = sorted(installed().keys() - pins.keys())
    if args.prune and extra:
        print(f"venv_lock: removing {', '.join(extra)} (not in {args.lock.name})", file=sys.stderr)
        subprocess.run(
            [sys.executable, "-m", "pip", "uninstall", "--quiet", "--yes", *extra], check=True
        )
    problems = differences(pins, installed())
    for line in problems:
        print(f"{args.lock.name}: {line}", file=sys.stderr)
    if problems:
        print("venv_lock: the venv differs from the lock; run scripts/setup", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
