"""Files that carry credentials (kubeconfigs with bearer tokens, private keys): owner-only.

A file is created with mode 0600 in the same call that creates it, so it is never readable by
others, not even for the moment between a default-mode create and a chmod; an existing file is
emptied and narrowed to 0600 before the secret is written into it (kubectl writes its kubeconfig
0600 too).
"""

from __future__ import annotations

import os
from pathlib import Path

MODE = 0o600


def write(path: Path | str, data: bytes | str, mode: int = MODE) -> Path:
    """Write `data` to `path` readable by its owner only (`mode`); returns the path."""
    target = Path(path)
    payload = data.encode() if isinstance(data, str) else data
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
    with os.fdopen(fd, "wb") as out:
        os.fchmod(fd, mode)  # an existing file keeps its old mode through O_CREAT
        out.write(payload)
    return target
