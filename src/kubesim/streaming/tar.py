"""A `tar` for exec handlers, so `kubectl cp` works against a runner's mounted files.

kubectl copies into a pod with `tar [--no-same-permissions --no-same-owner] -xmf - [-C dir]` and
out of one with `tar cf - <path>`. `tar_exec_handler(ctx.path)` serves both through the
container's volume mounts (`ctx.path` keeps every path inside them); register it with
`ctx.set_exec_handler({"tar": tar_exec_handler(ctx.path)})`.
"""

from __future__ import annotations

import io
import posixpath
import tarfile
from collections.abc import Callable
from pathlib import Path

from kubesim.streaming.runtime import ExecFunction, ExecProcess

Resolver = Callable[..., Path]
_USAGE = "tar: kubesim's tar supports only 'cf - PATH...' and 'xf - [-C DIR]'\n"


def _parse(argv: list[str]) -> tuple[str, list[str], str] | None:
    """(mode "c" or "x", paths, directory) from a tar command line, or None if unsupported."""
    mode = ""
    directory = "/"
    paths: list[str] = []
    archive_seen = False
    args = argv[1:]
    index = 0
    while index < len(args):
        arg = args[index]
        index += 1
        if arg == "-C" and index < len(args):
            directory = args[index]
            index += 1
        elif arg.startswith("--"):
            continue  # ownership/permission flags change nothing here
        elif not mode and (arg.startswith("-") or arg.isalpha()):
            letters = arg.lstrip("-")
            mode = "c" if "c" in letters else "x" if "x" in letters else ""
            if "f" in letters and index < len(args):
                archive_seen = args[index] == "-"
                index += 1
        elif arg.startswith("-"):
            continue
        else:
            paths.append(arg)
    if not mode or not archive_seen:
        return None
    return mode, paths, directory


def tar_exec_handler(resolve: Resolver) -> ExecFunction:
    """An exec handler implementing the two `tar` forms kubectl cp runs."""

    async def tar(proc: ExecProcess) -> int:
        parsed = _parse(proc.argv)
        if parsed is None:
            proc.stderr.write(_USAGE)
            return 2
        mode, paths, directory = parsed
        if mode == "c":
            return _create(proc, resolve, paths)
        return _extract(proc, resolve, directory, await proc.stdin.read())

    return tar


def _create(proc: ExecProcess, resolve: Resolver, paths: list[str]) -> int:
    buffer = io.BytesIO()
    status = 0
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for path in paths:
            try:
                source = resolve(path)
                archive.add(str(source), arcname=path.lstrip("/") or ".")
            except OSError as exc:
                reason = exc.strerror or "No such file or directory"
                proc.stderr.write(f"tar: {path}: Cannot stat: {reason}\n")
                status = 2
    if any(p.startswith("/") for p in paths):
        proc.stderr.write("tar: Removing leading `/' from member names\n")
    proc.stdout.write(buffer.getvalue())
    return status


def _extract(proc: ExecProcess, resolve: Resolver, directory: str, data: bytes) -> int:
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r") as archive:
            return _unpack(proc, resolve, directory, archive)
    except tarfile.TarError:
        proc.stderr.write("tar: This does not look like a tar archive\n")
        return 2


def _unpack(proc: ExecProcess, resolve: Resolver, directory: str, archive: tarfile.TarFile) -> int:
    status = 0
    for member in archive.getmembers():
        target = posixpath.normpath(posixpath.join(directory, member.name))
        try:
            destination = resolve(target, write=True)
            if member.isdir():
                destination.mkdir(parents=True, exist_ok=True)
            elif member.isfile():
                extracted = archive.extractfile(member)
                destination.parent.mkdir(parents=True, exist_ok=True)
                destination.write_bytes(extracted.read() if extracted else b"")
        except OSError as exc:
            proc.stderr.write(f"tar: {target}: Cannot open: {exc.strerror or exc}\n")
            status = 2
    return status
