"""The `--backend mock --machine NAME | --machine-file FILE` choice every GPU agent offers.

The mock layer is imported only when chosen: a real-GPU agent never loads it (its machine models
cost memory, see docs/exporter.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpu_operator.nvml.mock import MockMachine


class MachineChoiceError(Exception):
    """A mock machine that cannot be used, as one line for the user."""


def machine(name: str | None, file: Path | str | None, seed: int | None = None) -> MockMachine:
    """The mock machine named by a preset or described by a file (exactly one of them)."""
    from gpu_operator.nvml import machines, mock

    if (name is None) == (file is None):
        raise MachineChoiceError("--backend mock needs exactly one of --machine or --machine-file")
    try:
        if name is not None:
            return mock.MockMachine.from_preset(name, seed=seed)
        return mock.MockMachine.from_file(file or "", seed=seed)
    except (machines.UnknownMachine, machines.MachineFileError) as err:
        raise MachineChoiceError(str(err.args[0])) from None
