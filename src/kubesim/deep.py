"""Serving objects nested as deep as the real API server takes them (10,000 levels).

The real server's JSON and YAML decoders stop at 10,000 levels (`request_limits.MAX_DEPTH`), and
everything after them (merge and strategic merge patches, server-side apply's field sets,
pruning, equality) recurses on Go's growable stacks, so a write on an object that deep works.
kubesim's algorithms are recursive Python as well, and CPython stops them at its recursion
limit (1,000 frames by default), which a few hundred levels already reach. So a request whose
body or target object nests deeper than `SHALLOW` levels runs under `RECURSION_LIMIT` (the
`raised` context) for that request only; shallower requests keep the default limit, under
which a runaway recursion is still a clean RecursionError.

Why the raised limit is safe: since Python 3.11 a Python function calling a Python function
uses no C stack, so the frames of kubesim's own recursion cost heap, not stack. C stack goes to
the C-level recursion in between: dict equality, the json and msgspec codecs and generators
driven by builtins. Measured on the whole write path at 10,000 levels (create, update, merge,
JSON and apply patches, on the main resource and `/status`), it fits a 4 MiB thread stack; the
server runs on the main thread, whose stack is 8 MiB (`tests/kubesim/test_kubesim_deep_objects.py`
runs the same requests in a 4 MiB thread to keep that margin honest).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

# Bodies and objects up to this depth take the default recursion limit.
SHALLOW = 100
# Enough frames for 10,000 levels at up to five frames a level, plus the caller's own.
RECURSION_LIMIT = 60_000


@contextlib.contextmanager
def raised(needed: bool = True) -> Iterator[None]:
    """Run the block under RECURSION_LIMIT when `needed` (never lowering a higher limit).

    The block must not await: the limit is the interpreter's, so tasks that ran while it is
    raised would run under it too.
    """
    if not needed:
        yield
        return
    before = sys.getrecursionlimit()
    sys.setrecursionlimit(max(before, RECURSION_LIMIT))
    try:
        yield
    finally:
        sys.setrecursionlimit(before)
