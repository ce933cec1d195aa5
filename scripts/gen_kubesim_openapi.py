"""Generate kubesim's built-in OpenAPI definitions from the Kubernetes 1.35 schemas.

Source: the JSON-Schema 2020-12 definitions shipped in the dev dependency `kubernetes-validate`
(`kubernetes-json-schema/v1.35.0-local/_definitions.json`), which were converted from the real
server's OpenAPI v2 document. This script converts them back to OpenAPI v2 shapes: nullable types
(`["integer", "null"]`) become plain types, `$ref`s point at `#/definitions/`, the int-or-string
and quantity `oneOf`s become the server's `{type: string, format: int-or-string}` and
`{type: string}`, and the apiVersion/kind enums the converter added are removed. Description texts
are dropped (facts carry over, prose does not). Only GA group-versions are kept.

Usage: `python scripts/gen_kubesim_openapi.py [--check]`; `--check` exits 1 when the committed
file differs from what would be generated (a test runs it).
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUTPUT = ROOT / "src" / "kubesim" / "builtin_openapi.json.gz"
KUBERNETES_VERSION = "v1.35.0"
PRERELEASE = re.compile(r"\.v\d+(alpha|beta)\d+\.")
# The two definitions the JSON-Schema converter expressed as oneOf, in their OpenAPI v2 form.
SPECIAL: dict[str, dict[str, Any]] = {
    "io.k8s.apimachinery.pkg.util.intstr.IntOrString": {
        "type": "string",
        "format": "int-or-string",
    },
    "io.k8s.apimachinery.pkg.api.resource.Quantity": {"type": "string"},
}


def source_path() -> Path:
    """Where the installed kubernetes-validate keeps the 1.35 definitions."""
    import kubernetes_validate

    base = Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema"
    return base / f"{KUBERNETES_VERSION}-local" / "_definitions.json"


def convert(schema: Any, *, in_properties: bool = False) -> Any:
    """One schema (or a properties map when `in_properties`) in OpenAPI v2 form."""
    if isinstance(schema, list):
        return [convert(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    if in_properties:
        return {name: convert(sub) for name, sub in schema.items()}
    result: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "description":
            continue
        if key == "type" and isinstance(value, list):
            kinds = [v for v in value if v != "null"]
            result[key] = kinds[0] if len(kinds) == 1 else kinds
        elif key == "$ref":
            result[key] = value.replace("#/$defs/", "#/definitions/")
        elif key == "properties":
            result[key] = convert(value, in_properties=True)
        elif key in ("items", "additionalProperties", "not"):
            result[key] = convert(value)
        elif key in ("allOf", "anyOf", "oneOf"):
            result[key] = [convert(v) for v in value]
        else:
            result[key] = value
    return result


def generate() -> bytes:
    """The gzip-compressed JSON document of every GA definition, deterministic byte for byte."""
    raw = json.loads(source_path().read_text())["$defs"]
    definitions: dict[str, Any] = {}
    for name in sorted(raw):
        if PRERELEASE.search(name):
            continue
        schema = SPECIAL.get(name) or convert(raw[name])
        if schema.get("x-kubernetes-group-version-kind"):
            # The converter pinned apiVersion/kind with enums; the server's document has none.
            for field in ("apiVersion", "kind"):
                prop = schema.get("properties", {}).get(field)
                if isinstance(prop, dict):
                    prop.pop("enum", None)
        definitions[name] = schema
    document = {
        "source": f"Kubernetes {KUBERNETES_VERSION} via kubernetes-validate; no descriptions",
        "definitions": definitions,
    }
    text = json.dumps(document, sort_keys=True, separators=(",", ":")).encode()
    return gzip.compress(text, compresslevel=9, mtime=0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args()
    data = generate()
    if args.check:
        current = OUTPUT.read_bytes() if OUTPUT.exists() else b""
        if not current or gzip.decompress(current) != gzip.decompress(data):
            print(
                f"{OUTPUT.relative_to(ROOT)} is stale: run {Path(__file__).name}", file=sys.stderr
            )
            return 1
        return 0
    OUTPUT.write_bytes(data)
    print(f"wrote {OUTPUT.relative_to(ROOT)} ({len(data)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
