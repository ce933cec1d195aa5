"""SPDY/3.1 framing, as far as Kubernetes port-forwarding uses it (server side).

Control frames: 1 bit control flag, 15 bits version (3), 16 bits type, 8 bits flags, 24 bits
length, then the payload. Data frames: 1 bit zero, 31 bits stream id, 8 bits flags, 24 bits
length, payload. Header blocks (SYN_STREAM, SYN_REPLY, HEADERS) are a 32-bit pair count and
32-bit length-prefixed names and values, compressed with one zlib stream per direction that is
primed with the protocol's fixed dictionary and sync-flushed after every block.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field

VERSION = 3
FLAG_FIN = 0x01
SYN_STREAM = 1
SYN_REPLY = 2
RST_STREAM = 3
SETTINGS = 4
PING = 6
GOAWAY = 7
HEADERS = 8
WINDOW_UPDATE = 9
# RST_STREAM status codes used here.
PROTOCOL_ERROR = 1
REFUSED_STREAM = 3
CANCEL = 5

# The SPDY/3 header compression dictionary: these length-prefixed words, then the tail text.
_DICTIONARY_WORDS = (
    "options",
    "head",
    "post",
    "put",
    "delete",
    "trace",
    "accept",
    "accept-charset",
    "accept-encoding",
    "accept-language",
    "accept-ranges",
    "age",
    "allow",
    "authorization",
    "cache-control",
    "connection",
    "content-base",
    "content-encoding",
    "content-language",
    "content-length",
    "content-location",
    "content-md5",
    "content-range",
    "content-type",
    "date",
    "etag",
    "expect",
    "expires",
    "from",
    "host",
    "if-match",
    "if-modified-since",
    "if-none-match",
    "if-range",
    "if-unmodified-since",
    "last-modified",
    "location",
    "max-forwards",
    "pragma",
    "proxy-authenticate",
    "proxy-authorization",
    "range",
    "referer",
    "retry-after",
    "server",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "user-agent",
    "vary",
    "via",
    "warning",
    "www-authenticate",
    "method",
    "get",
    "status",
    "200 OK",
    "version",
    "HTTP/1.1",
    "url",
    "public",
    "set-cookie",
    "keep-alive",
    "origin",
)
_DICTIONARY_TAIL = (
    "100101201202205206300302303304305306307402405406407408409410411412413414415416417502504505"
    "203 Non-Authoritative Information204 No Content301 Moved Permanently400 Bad Request401 "
    "Unauthorized403 Forbidden404 Not Found500 Internal Server Error501 Not Implemented503 "
    "Service UnavailableJan Feb Mar Apr May Jun Jul Aug Sept Oct Nov Dec 00:00:00 Mon, Tue, "
    "Wed, Thu, Fri, Sat, Sun, GMTchunked,text/html,image/png,image/jpg,image/gif,"
    "application/xml,application/xhtml+xml,text/plain,text/javascript,publicprivatemax-age="
    "gzip,deflate,sdchcharset=utf-8charset=iso-8859-1,utf-,*,enq=0."
)
DICTIONARY = (
    b"".join(struct.pack(">I", len(w)) + w.encode() for w in _DICTIONARY_WORDS)
    + _DICTIONARY_TAIL.encode()
)


class ProtocolError(Exception):
    """The peer sent something that is not valid SPDY/3."""


@dataclass
class Frame:
    """A decoded frame: control frames have a type; data frames have type 0 and a stream id."""

    control: bool
    type: int
    flags: int
    stream_id: int = 0
    payload: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def fin(self) -> bool:
        """Whether the sender half-closed the stream with this frame."""
        return bool(self.flags & FLAG_FIN)


class HeaderCodec:
    """The two zlib contexts of one SPDY connection."""

    def __init__(self) -> None:
        self._inflate = zlib.decompressobj(zdict=DICTIONARY)
        self._deflate = zlib.compressobj(
            9, zlib.DEFLATED, 15, 8, zlib.Z_DEFAULT_STRATEGY, DICTIONARY
        )

    def decode(self, block: bytes) -> dict[str, str]:
        """Inflate and parse a header block (names lowercased; NUL-joined values kept joined)."""
        try:
            raw = self._inflate.decompress(block)
        except zlib.error as exc:
            raise ProtocolError(f"bad header block: {exc}") from exc
        headers: dict[str, str] = {}
        try:
            (count,) = struct.unpack_from(">I", raw, 0)
            offset = 4
            for _ in range(count):
                (size,) = struct.unpack_from(">I", raw, offset)
                name = raw[offset + 4 : offset + 4 + size].decode()
                offset += 4 + size
                (size,) = struct.unpack_from(">I", raw, offset)
                value = raw[offset + 4 : offset + 4 + size].decode()
                offset += 4 + size
                headers[name.lower()] = value
        except (struct.error, UnicodeDecodeError) as exc:
            raise ProtocolError(f"bad header block: {exc}") from exc
        return headers

    def encode(self, headers: dict[str, str]) -> bytes:
        """Serialise and compress a header block."""
        raw = struct.pack(">I", len(headers))
        for name, value in headers.items():
            raw += struct.pack(">I", len(name)) + name.lower().encode()
            raw += struct.pack(">I", len(value.encode())) + value.encode()
        return self._deflate.compress(raw) + self._deflate.flush(zlib.Z_SYNC_FLUSH)


class FrameReader:
    """Reassembles frames from arbitrary chunks of the byte stream."""

    def __init__(self, codec: HeaderCodec) -> None:
        self._codec = codec
        self._buffer = b""

    def feed(self, data: bytes) -> list[Frame]:
        """Add bytes; return every frame now complete."""
        self._buffer += data
        frames: list[Frame] = []
        while len(self._buffer) >= 8:
            first, second = struct.unpack_from(">II", self._buffer, 0)
            length = second & 0xFFFFFF
            if len(self._buffer) < 8 + length:
                break
            payload = self._buffer[8 : 8 + length]
            self._buffer = self._buffer[8 + length :]
            flags = second >> 24
            if first & 0x80000000:
                version = (first >> 16) & 0x7FFF
                if version != VERSION:
                    raise ProtocolError(f"unsupported SPDY version {version}")
                frames.append(self._control(first & 0xFFFF, flags, payload))
            else:
                frames.append(Frame(False, 0, flags, first & 0x7FFFFFFF, payload))
        return frames

    def _control(self, kind: int, flags: int, payload: bytes) -> Frame:
        frame = Frame(True, kind, flags, payload=payload)
        if (
            kind in (SYN_STREAM, SYN_REPLY, RST_STREAM, HEADERS, WINDOW_UPDATE)
            and len(payload) >= 4
        ):
            frame.stream_id = struct.unpack_from(">I", payload, 0)[0] & 0x7FFFFFFF
        if kind == SYN_STREAM:
            frame.headers = self._codec.decode(payload[10:])
        elif kind in (SYN_REPLY, HEADERS):
            frame.headers = self._codec.decode(payload[4:])
        return frame


def _control(kind: int, flags: int, payload: bytes) -> bytes:
    return struct.pack(">HHI", 0x8000 | VERSION, kind, (flags << 24) | len(payload)) + payload


def syn_reply(codec: HeaderCodec, stream_id: int, *, fin: bool = False) -> bytes:
    """Accept a stream the peer opened (with no headers)."""
    block = codec.encode({})
    return _control(SYN_REPLY, FLAG_FIN if fin else 0, struct.pack(">I", stream_id) + block)


def data(stream_id: int, payload: bytes, *, fin: bool = False) -> bytes:
    """A data frame (empty with `fin` to half-close)."""
    return (
        struct.pack(">II", stream_id & 0x7FFFFFFF, ((FLAG_FIN if fin else 0) << 24) | len(payload))
        + payload
    )


def rst_stream(stream_id: int, status: int) -> bytes:
    """Abort a stream."""
    return _control(RST_STREAM, 0, struct.pack(">II", stream_id, status))


def ping(ping_id: int) -> bytes:
    """A ping (the answer to one echoes its id)."""
    return _control(PING, 0, struct.pack(">I", ping_id))


def goaway(last_stream_id: int, status: int = 0) -> bytes:
    """End the session."""
    return _control(GOAWAY, 0, struct.pack(">II", last_stream_id, status))
