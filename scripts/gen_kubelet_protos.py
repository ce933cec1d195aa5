"""Generate the Python modules of the kubelet gRPC APIs in `src/kubeletapi` from their .proto files.

Each `api.proto` under `src/kubeletapi` gets `api_pb2.py` (messages), `api_pb2.pyi` (their types)
and `api_pb2_grpc.py` (stubs, servicers), written by `grpc_tools.protoc` (the `grpcio-tools` dev
dependency, pinned in pyproject.toml because its version is stamped into the output). The include
root is `src`, so the modules import each other as `kubeletapi.<api>.<version>.api_pb2`.

Usage: `python scripts/gen_kubelet_protos.py` rewrites the generated files; `--check` exits 1 when
the committed ones differ from what the installed grpc_tools gives.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"
PACKAGE = SRC / "kubeletapi"
OUTPUTS = ("api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py")


def protos() -> list[Path]:
    """The .proto files of the package, in a stable order."""
    return sorted(PACKAGE.rglob("*.proto"))


def generate(out_dir: Path) -> dict[Path, bytes]:
    """Run protoc into `out_dir`; returns each generated file's path (relative to src) and bytes."""
    from grpc_tools import protoc  # a dev dependency: imported only when generating

    files = [str(p.relative_to(SRC)) for p in protos()]
    args = [
        "grpc_tools.protoc",
        f"-I{SRC}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *files,
    ]
    code = protoc.main(args)
    if code != 0:
        raise SystemExit(f"protoc failed with exit code {code}")
    result: dict[Path, bytes] = {}
    for proto in protos():
        relative_dir = proto.parent.relative_to(SRC)
        for name in OUTPUTS:
            generated = out_dir / relative_dir / name
            result[relative_dir / name] = generated.read_bytes()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check", action="store_true", help="compare with the committed files, write nothing"
    )
    options = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        generated = generate(Path(tmp))
    stale = [path for path, data in generated.items() if _read(SRC / path) != data]
    if options.check:
        for path in stale:
            print(f"out of date: src/{path} (run python scripts/gen_kubelet_protos.py)")
        return 1 if stale else 0
    for path in stale:
        (SRC / path).write_bytes(generated[path])
        print(f"wrote src/{path}")
    return 0


def _read(path: Path) -> bytes | None:
    return path.read_bytes() if path.exists() else None


if __name__ == "__main__":
    sys.exit(main())
