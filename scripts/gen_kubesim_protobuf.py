"""Generate kubesim's protobuf schemas from the Go type metadata compiled into kubectl and helm.

The Kubernetes API types are Go structs whose fields carry struct tags such as
`json:"metadata,omitempty" protobuf:"bytes,1,opt,name=metadata"`. A Go binary keeps every
reachable type's runtime descriptor (internal/abi.Type and its kind-specific extensions) including
struct field names and full tags, so the field numbers can be read back from the very binaries our
setup installs instead of being typed by hand. This script:

1. parses the ELF section headers of the binary (static, non-PIE amd64: pointers inside type
   descriptors are absolute virtual addresses);
2. reads `.typelink`, an int32 table of type offsets relative to the start of the type data, which
   for these binaries is the start of `.rodata` (checked: every entry then decodes to a valid kind
   and a readable name);
3. walks the type graph from those roots (pointer/slice/array/map element types, struct fields)
   using the Go 1.24/1.25 amd64 layouts of abi.Type (48 bytes: Size_, PtrBytes, Hash, TFlag,
   Align_, FieldAlign_, Kind_, Equal, GCData, Str, PtrToThis), PtrType/SliceType (+Elem at 48),
   ArrayType (+Elem at 48, 72 bytes), the swiss-table map type (+Key at 48, +Elem at 56, 112 bytes),
   StructType (+PkgPath at 48, +Fields slice at 56, 80 bytes; StructField = Name, Typ, Offset) and
   UncommonType (PkgPath name offset, right after the kind-specific part when TFlagUncommon);
   names are abi.Name encodings (flag byte, uvarint length, bytes, optional uvarint-length tag);
4. keeps the named structs of the API packages (k8s.io/api/<group>/<GA version>, apimachinery's
   meta/v1, runtime, resource and intstr, apiextensions v1 from helm) and everything they reference,
   and writes one JSON document with, per message, its fields in Go declaration order.

Usage: `python scripts/gen_kubesim_protobuf.py` rewrites src/kubesim/protobuf/schemas.json;
`--check` exits 1 when the committed file differs from what the binaries give.
"""

from __future__ import annotations

import argparse
import json
import re
import struct
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BINARIES = (ROOT / ".tools" / "bin" / "kubectl", ROOT / ".tools" / "bin" / "helm")
OUTPUT = ROOT / "src" / "kubesim" / "protobuf" / "schemas.json"

# abi.Kind values (internal/abi/type.go); the low five bits of Kind_ hold the kind.
BOOL, INT, INT8, INT16, INT32, INT64 = 1, 2, 3, 4, 5, 6
UINT, UINT8, UINT16, UINT32, UINT64, UINTPTR = 7, 8, 9, 10, 11, 12
FLOAT32, FLOAT64 = 13, 14
ARRAY, CHAN, FUNC, INTERFACE, MAP, POINTER, SLICE, STRING, STRUCT = (
    17,
    18,
    19,
    20,
    21,
    22,
    23,
    24,
    25,
)
KIND_MASK = 0x1F
TFLAG_UNCOMMON, TFLAG_EXTRA_STAR, TFLAG_NAMED = 1, 2, 4
TYPE_HEADER = 48
# Size of each kind's descriptor, where its UncommonType starts (amd64, Go 1.24+ swiss maps).
DESCRIPTOR_SIZE = {
    STRUCT: 80,
    POINTER: 56,
    SLICE: 56,
    ARRAY: 72,
    CHAN: 64,
    FUNC: 56,
    INTERFACE: 80,
    MAP: 112,
}
SCALARS = {
    BOOL: "bool",
    INT: "int64",
    INT8: "int32",
    INT16: "int32",
    INT32: "int32",
    INT64: "int64",
    UINT: "uint64",
    UINT8: "uint32",
    UINT16: "uint32",
    UINT32: "uint32",
    UINT64: "uint64",
    FLOAT32: "float32",
    FLOAT64: "float64",
    STRING: "string",
}
META = "k8s.io/apimachinery/pkg/apis/meta/v1"
# Packages whose structs are wire types; k8s.io/api groups are kept at GA versions only.
API_PACKAGE = re.compile(
    r"^(k8s\.io/api/[a-z0-9]+/v\d+"
    r"|k8s\.io/apimachinery/pkg/apis/meta/v1"
    r"|k8s\.io/apimachinery/pkg/runtime"
    r"|k8s\.io/apimachinery/pkg/api/resource"
    r"|k8s\.io/apimachinery/pkg/util/intstr"
    r"|k8s\.io/apiextensions-apiserver/pkg/apis/apiextensions/v1)$"
)
# Modules whose versions are recorded in the output, read from the binary's build info.
MODULES = (
    "k8s.io/api",
    "k8s.io/apimachinery",
    "k8s.io/apiextensions-apiserver",
    "k8s.io/client-go",
)


class BinaryError(Exception):
    """The binary is not the static Go ELF this reader understands."""


@dataclass
class GoType:
    """What this generator needs of one Go type descriptor."""

    addr: int
    kind: int
    name: str
    named: bool
    pkg: str = ""
    elem: int = 0
    key: int = 0
    fields: list[tuple[str, int, str, bool]] = field(default_factory=list)

    @property
    def qualified(self) -> str:
        """`pkgpath.Name` for a named type (the descriptor's name is `pkgname.Name`)."""
        return f"{self.pkg}.{self.name.rsplit('.', 1)[-1]}"


class GoBinary:
    """Random access to the type descriptors of a static Go ELF binary."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.data = path.read_bytes()
        if self.data[:4] != b"\x7fELF" or self.data[4] != 2:
            raise BinaryError(f"{path}: not a 64-bit ELF file")
        shoff = struct.unpack_from("<Q", self.data, 0x28)[0]
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", self.data, 0x3A)
        raw = [
            struct.unpack_from("<IIQQQQ", self.data, shoff + i * shentsize) for i in range(shnum)
        ]
        names_at = raw[shstrndx][4]
        self.sections: dict[str, tuple[int, int, int, int]] = {}
        for name_off, kind, _flags, addr, offset, size in raw:
            start = names_at + name_off
            name = self.data[start : self.data.index(b"\0", start)].decode()
            self.sections[name] = (kind, addr, offset, size)
        for needed in (".rodata", ".typelink"):
            if needed not in self.sections:
                raise BinaryError(f"{path}: no {needed} section (stripped of Go metadata?)")
        # Type data starts at .rodata for the external-link-free binaries Go builds here.
        self.types_base = self.sections[".rodata"][1]
        self._loaded = [
            (addr, offset, size)
            for kind, addr, offset, size in self.sections.values()
            if kind != 8 and addr  # 8 = SHT_NOBITS (no bytes in the file)
        ]
        self.types: dict[int, GoType] = {}

    def offset(self, addr: int) -> int:
        """The file offset of a virtual address."""
        for start, offset, size in self._loaded:
            if start <= addr < start + size:
                return addr - start + offset
        raise BinaryError(f"{self.path}: address {addr:#x} is outside every loaded section")

    def _uvarint(self, pos: int) -> tuple[int, int]:
        value = shift = 0
        while True:
            byte = self.data[pos]
            pos += 1
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value, pos
            shift += 7

    def name(self, addr: int) -> tuple[int, str, str]:
        """(flags, name, tag) of the abi.Name at `addr`."""
        pos = self.offset(addr)
        flags = self.data[pos]
        length, pos = self._uvarint(pos + 1)
        text = self.data[pos : pos + length].decode()
        pos += length
        tag = ""
        if flags & 2:
            tag_length, pos = self._uvarint(pos)
            tag = self.data[pos : pos + tag_length].decode()
        return flags, text, tag

    def typelinks(self) -> list[int]:
        """Addresses of the types listed in .typelink."""
        _kind, _addr, offset, size = self.sections[".typelink"]
        offsets = struct.unpack_from(f"<{size // 4}i", self.data, offset)
        return [self.types_base + o for o in offsets]

    def type_at(self, addr: int) -> GoType:
        """The decoded descriptor at `addr` (cached)."""
        cached = self.types.get(addr)
        if cached is not None:
            return cached
        pos = self.offset(addr)
        tflag, kind_byte = self.data[pos + 20], self.data[pos + 23]
        str_off = struct.unpack_from("<i", self.data, pos + 40)[0]
        kind = kind_byte & KIND_MASK
        if not 1 <= kind <= 26:
            raise BinaryError(f"{self.path}: type at {addr:#x} has invalid kind {kind}")
        name = self.name(self.types_base + str_off)[1]
        if tflag & TFLAG_EXTRA_STAR:
            name = name[1:]
        t = GoType(addr, kind, name, bool(tflag & TFLAG_NAMED))
        self.types[addr] = t
        if tflag & TFLAG_UNCOMMON:
            uncommon = pos + DESCRIPTOR_SIZE.get(kind, TYPE_HEADER)
            pkg_off = struct.unpack_from("<i", self.data, uncommon)[0]
            if pkg_off:
                t.pkg = self.name(self.types_base + pkg_off)[1]
        if kind in (POINTER, SLICE, ARRAY, CHAN):
            t.elem = struct.unpack_from("<Q", self.data, pos + 48)[0]
        elif kind == MAP:
            t.key, t.elem = struct.unpack_from("<QQ", self.data, pos + 48)
        elif kind == STRUCT:
            fields_at, count = struct.unpack_from("<QQ", self.data, pos + 56)
            for i in range(count):
                name_ptr, typ, _offset = struct.unpack_from(
                    "<QQQ", self.data, self.offset(fields_at + 24 * i)
                )
                flags, fname, tag = self.name(name_ptr)
                t.fields.append((fname, typ, tag, bool(flags & 8)))
        return t

    def walk(self) -> dict[int, GoType]:
        """Every type reachable from .typelink."""
        stack = self.typelinks()
        # The compiler lists only unnamed composite types in .typelink; anything else means the
        # assumed start of the type data is wrong.
        composite = {ARRAY, CHAN, FUNC, MAP, POINTER, SLICE, STRUCT}
        for addr in stack:
            t = self.type_at(addr)
            if t.named or t.kind not in composite:
                raise BinaryError(
                    f"{self.path}: .typelink entry {t.name!r} is not an unnamed "
                    "composite type; the type data does not start at .rodata"
                )
        seen: set[int] = set()
        while stack:
            addr = stack.pop()
            if not addr or addr in seen:
                continue
            seen.add(addr)
            t = self.type_at(addr)
            stack.extend(a for a in (t.elem, t.key) if a)
            stack.extend(f[1] for f in t.fields)
        return {a: self.types[a] for a in seen}

    def module_versions(self) -> dict[str, str]:
        """Versions of the Kubernetes modules linked in, from the embedded build info."""
        found = {}
        for module in MODULES:
            match = re.search(
                rb"\ndep\t" + re.escape(module.encode()) + rb"\t([^\t\n]+)", self.data
            )
            if match:
                found[module] = match.group(1).decode()
        return found


def struct_tag(tag: str, key: str) -> str | None:
    """The value of `key` in a Go struct tag (reflect.StructTag.Get without the quirks)."""
    match = re.search(r"(?:^|\s)" + re.escape(key) + r':"((?:[^"\\]|\\.)*)"', tag)
    return match.group(1) if match else None


class Generator:
    """Builds the schema document from one or more binaries (earlier ones win per package)."""

    def __init__(self) -> None:
        self.messages: dict[str, list[list[Any]]] = {}
        self.sources: dict[str, dict[str, str]] = {}

    def add_binary(self, binary: GoBinary) -> None:
        types = binary.walk()
        self.sources[binary.path.name] = binary.module_versions()
        known_packages = {name.rsplit(".", 1)[0] for name in self.messages}
        roots = [
            t
            for t in types.values()
            if t.kind == STRUCT
            and t.named
            and API_PACKAGE.match(t.pkg)
            and t.pkg not in known_packages
            and any(struct_tag(f[2], "protobuf") for f in t.fields)
        ]
        pending = sorted(roots, key=lambda t: t.qualified)
        while pending:
            t = pending.pop()
            if t.qualified in self.messages:
                continue
            self.messages[t.qualified] = fields = []
            for fname, ftype, tag, embedded in t.fields:
                entry = self.field(binary, t, fname, binary.type_at(ftype), tag, embedded, pending)
                if entry is not None:
                    fields.append(entry)

    def field(
        self,
        binary: GoBinary,
        owner: GoType,
        fname: str,
        ftype: GoType,
        tag: str,
        embedded: bool,
        pending: list[GoType],
    ) -> list[Any] | None:
        """[json name, proto number, type, flags] for one struct field, or None if unexported."""
        if not fname[:1].isupper():
            return None
        json_tag = struct_tag(tag, "json")
        proto_tag = struct_tag(tag, "protobuf")
        json_name, _, options = (json_tag or "").partition(",")
        flags = ""
        if "omitempty" in options.split(","):
            flags += "e"
        if "omitzero" in options.split(","):
            flags += "z"
        if json_name == "-" and not options:
            json_name = "-"
        elif not json_name:
            if embedded and ftype.kind == STRUCT:
                flags += "i"
            else:
                json_name = fname
        number = 0
        label = ""
        if proto_tag and proto_tag != "-":
            parts = proto_tag.split(",")
            number = int(parts[1])
            label = parts[2]
        elif json_name == "-":
            return None
        type_expr = self.type_expr(binary, ftype, label, pending)
        return [json_name, number, type_expr, flags]

    def type_expr(self, binary: GoBinary, t: GoType, label: str, pending: list[GoType]) -> str:
        """The compact type grammar of schemas.json (see the codec's registry)."""
        if t.kind in SCALARS:
            return SCALARS[t.kind]
        if t.kind == POINTER:
            return "*" + self.type_expr(binary, binary.type_at(t.elem), label, pending)
        if t.kind == SLICE:
            elem = binary.type_at(t.elem)
            if elem.kind == UINT8:
                return "bytes"
            inner = "[]" + self.type_expr(binary, elem, "rep", pending)
            # A named slice that protobuf cannot carry as a plain repeated field (a map value,
            # or a field declared `opt`) is generated as a message {repeated items = 1}.
            if t.named and label != "rep":
                name = t.qualified
                if name not in self.messages:
                    self.messages[name] = [["items", 1, inner, "l"]]
                return name
            return inner
        if t.kind == MAP:
            key = self.type_expr(binary, binary.type_at(t.key), "", pending)
            value = self.type_expr(binary, binary.type_at(t.elem), "", pending)
            return f"map[{key}]{value}"
        if t.kind == STRUCT:
            if not t.named:
                raise BinaryError(f"anonymous struct field type {t.name} is not supported")
            if t.qualified not in self.messages:
                pending.append(t)
            return t.qualified
        if t.kind == INTERFACE:
            return "interface"
        raise BinaryError(f"unsupported Go kind {t.kind} for {t.name}")

    def document(self) -> str:
        """The JSON text: stable order, one message per line for readable diffs."""
        lines = [
            "{",
            '"comment": "Generated by scripts/gen_kubesim_protobuf.py from the Go type metadata '
            'of the kubectl and helm binaries; do not edit. Field: [json name (\\"\\" = inline '
            "embedded), proto number (0 = JSON only), type, flags (e omitempty, z omitzero, "
            'i inline, l list wrapper)].",',
            '"sources": ' + json.dumps(self.sources, sort_keys=True) + ",",
            '"messages": {',
        ]
        names = sorted(self.messages)
        for i, name in enumerate(names):
            comma = "," if i < len(names) - 1 else ""
            body = json.dumps(self.messages[name], separators=(",", ":"))
            lines.append(f"{json.dumps(name)}: {body}{comma}")
        lines.extend(["}", "}"])
        return "\n".join(lines) + "\n"


def generate(binaries: tuple[Path, ...] = BINARIES) -> str:
    """The schemas.json text for the given binaries."""
    generator = Generator()
    for path in binaries:
        generator.add_binary(GoBinary(path))
    return generator.document()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the committed file differs")
    parser.add_argument("--out", type=Path, default=OUTPUT)
    args = parser.parse_args(argv)
    missing = [str(p) for p in BINARIES if not p.exists()]
    if missing:
        print(f"gen_kubesim_protobuf: missing {', '.join(missing)} (run scripts/setup)")
        return 2
    text = generate()
    if args.check:
        current = args.out.read_text() if args.out.exists() else ""
        if current != text:
            print(f"gen_kubesim_protobuf: {args.out} is stale; rerun the script")
            return 1
        return 0
    args.out.write_text(text)
    print(f"gen_kubesim_protobuf: wrote {args.out} ({len(text)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
