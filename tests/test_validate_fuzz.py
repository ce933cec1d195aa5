"""`gpu-operator validate` fuzzed: any generated document exits 0, 1 or 2, never a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

# The fuzz loop runs in a child process, so a segfault in a C extension shows as exit -11
# instead of taking pytest down; hypothesis's own deadline is replaced by a wall-clock budget.
_CHILD = textwrap.dedent(
    """
    import json, sys, time, traceback
    from hypothesis import HealthCheck, Phase, given, settings, strategies as st
    from typer.testing import CliRunner
    from gpu_operator.cli import app

    budget, out = float(sys.argv[1]), sys.argv[2]
    runner = CliRunner()
    scalars = st.one_of(
        st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(), st.text(max_size=20)
    )
    values = st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=4)
        | st.dictionaries(st.text(max_size=12), inner, max_size=4),
        max_leaves=30,
    )
    sections = st.sampled_from(
        ["driver", "operator", "daemonsets", "toolkit", "devicePlugin", "mig", "validator"]
    )
    spec = st.one_of(values, st.dictionaries(sections, values, max_size=5))
    kind = st.sampled_from(["ClusterPolicy", "NVIDIADriver", "List", "ConfigMap"])
    doc = st.fixed_dictionaries(
        {"apiVersion": st.just("nvidia.com/v1"), "kind": kind, "spec": spec},
        optional={"metadata": values | st.just({"name": "cp"}), "items": values},
    )
    tags = st.sampled_from(["!!float x", "!!int 1.5", "!!bool maybe", "!!timestamp x",
                            "!!binary @@", "&a [*a]", "!custom 1", "!!str", "*nope",
                            "!!map [1, 2]", "!!map 5", "!!map", "!!set {a}", "!!omap [a: 1]",
                            "!!pairs [a: 1]", "!!seq {a: 1}", "!!str [1]", "!!null {a: 1}",
                            ".nan", "-.inf", "1.0e+999", "!!float 1e999", "1" * 5000,
                            "0x" + "f" * 300])
    # Numbers as JSON text: within and out of what the API server holds, and non-JSON ones.
    numbers = st.sampled_from(["1" * 5000, "-" + "9" * 310, "1e999", "-1e309", "NaN",
                               "Infinity", "-Infinity", "1.7976931348623157e308", "1e-999",
                               "123456789012345678901234567890"])
    places = st.sampled_from(["spec: {}", "metadata: {}", "spec: {driver: {}}", "{}",
                              "items:\\n- {}", "mig-configs: {}"])

    def nested(depth, flow):
        return ("[" * depth + "]" * depth) if flow else "".join(
            " " * i + "a:\\n" for i in range(1, min(depth, 1500) + 1))

    @st.composite
    def texts(draw):
        obj = draw(doc)
        style = draw(st.sampled_from(
            ["json", "yaml", "tag", "deep", "dup", "raw", "tagged", "number"]))
        if style == "json":
            return json.dumps(obj)
        if style == "number":
            text = json.dumps(obj)
            return text[:-1] + ', "n": [' + draw(numbers) + "]}"
        if style == "tagged":
            # A tag or shape where a mapping is expected (the document, spec, metadata, ...).
            value = draw(tags)
            place = draw(places)
            prefix = "" if place == "{}" else "apiVersion: nvidia.com/v1\\nkind: ClusterPolicy\\n"
            return prefix + place.replace("{}", value, 1) + "\\n"
        if style == "raw":
            return draw(st.text(alphabet="{}[]:-,!&*|>'\\"# \\nab1", max_size=80))
        head = "apiVersion: nvidia.com/v1\\nkind: ClusterPolicy\\nmetadata: {name: cp}\\n"
        if style == "tag":
            return head + "spec:\\n  driver: {version: " + draw(tags) + "}\\n"
        if style == "deep":
            depth = draw(st.sampled_from([50, 99, 100, 101, 600, 5000, 30000]))
            flow = draw(st.booleans())
            body = "spec: " + nested(depth, True) if flow else "spec:\\n" + nested(depth, False)
            return head + body
        if style == "dup":
            return head + "spec:\\n  driver: {}\\n  driver: " + json.dumps(obj["spec"]) + "\\n"
        return json.dumps(obj)  # JSON is YAML; the YAML loader sees it when it starts with a letter

    seen = {"runs": 0, "codes": {}}
    start = time.monotonic()

    @settings(max_examples=int(sys.argv[3]), deadline=None, database=None,
              phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    @given(texts())
    def run(text):
        if time.monotonic() - start > budget:
            return
        result = runner.invoke(app, ["validate", "-f", "-"], input=text)
        seen["runs"] += 1
        code = result.exit_code
        seen["codes"][str(code)] = seen["codes"].get(str(code), 0) + 1
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            tb = "".join(traceback.format_exception(result.exception))
            raise AssertionError(f"crash on {text[:300]!r}:\\n{tb}")
        assert code in (0, 1, 2), (code, text[:300])
        assert "Traceback" not in result.output

    try:
        run()
    finally:
        with open(out, "w") as f:
            json.dump(seen, f)
    """
)


def _fuzz(tmp_path: Path, seconds: float, examples: int) -> dict[str, object]:
    out = tmp_path / "seen.json"
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    result = subprocess.run(
        [sys.executable, "-c", _CHILD, str(seconds), str(out), str(examples)],
        capture_output=True,
        text=True,
        timeout=seconds + 300,
        env=env,
    )
    assert result.returncode == 0, (result.returncode, result.stdout[-3000:], result.stderr[-3000:])
    seen: dict[str, object] = json.loads(out.read_text())
    return seen


def test_validate_fuzz_never_crashes_short(tmp_path: Path) -> None:
    seen = _fuzz(tmp_path, 5.0, 300)
    assert isinstance(seen["runs"], int)
    assert seen["runs"] > 0


@pytest.mark.slow
def test_validate_fuzz_never_crashes_long(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    # scripts/test runs every marker; two minutes of fuzzing only when asked for with -m slow.
    if "slow" not in str(request.config.getoption("markexpr")):
        pytest.skip("the long fuzz run needs -m slow")
    seen = _fuzz(tmp_path, 120.0, 20_000)
    assert isinstance(seen["runs"], int)
    assert seen["runs"] > 100
