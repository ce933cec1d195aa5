"""The validator's container on a real node: its own filesystem, programs run as processes, and
the termination message written to `terminationMessagePath`."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from gpu_operator.agents.validator.protocols import ProgramResult

NOT_FOUND_EXIT = 127
NOT_EXECUTABLE_EXIT = 126
# Variables whose value is a list: a value the validator adds goes in front (as upstream's
# LD_PRELOAD for the driver container's libraries).
PATH_LISTS = ("LD_PRELOAD", "LD_LIBRARY_PATH", "PATH")


def merged_env(base: Mapping[str, str], extra: Mapping[str, str]) -> dict[str, str]:
    """`base` with `extra` added; list variables get the new entries first."""
    env = dict(base)
    for name, value in extra.items():
        current = env.get(name)
        separator = " " if name == "LD_PRELOAD" else ":"
        env[name] = f"{value}{separator}{current}" if name in PATH_LISTS and current else value
    return env


class LocalContainer:
    """This process's own container."""

    def __init__(self, termination_message_path: str = "/dev/termination-log") -> None:
        self.termination_message_path = termination_message_path

    def path(self, container_path: str) -> Path:
        return Path(container_path)

    async def run(self, argv: Sequence[str], env: Mapping[str, str] | None = None) -> ProgramResult:
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=merged_env(os.environ, env or {}),
            )
        except FileNotFoundError:
            where = "no such file or directory" if "/" in argv[0] else "not found in $PATH"
            return ProgramResult(
                NOT_FOUND_EXIT, "", f'exec: "{argv[0]}": executable file {where}\n'
            )
        except PermissionError as denied:
            return ProgramResult(NOT_EXECUTABLE_EXIT, "", f"exec: {argv[0]}: {denied.strerror}\n")
        out, err = await proc.communicate()
        return ProgramResult(
            proc.returncode or 0, out.decode(errors="replace"), err.decode(errors="replace")
        )

    def write_termination_message(self, text: str) -> None:
        Path(self.termination_message_path).write_text(text)
