"""PostgreSQL protocol v3 framing: bytes into typed frontend messages, backend messages into bytes.

This module owns the byte layout of every message dpproxy reads or writes and the limits on what a
peer may send (message lengths, field counts). It knows nothing of SQL, sessions or sockets: the
session decides what a message means, the server moves the bytes. A frame that cannot be read
raises ProtocolViolation (08P01), after which the connection must be closed; a well-framed message
whose text is not UTF-8 decodes to `Undecodable`, an ordinary error the session reports.

Over 600 lines, kept whole on purpose: it is one transcription of PostgreSQL's "Message Formats",
both directions side by side, and half of it is the declarations of 43 small messages; callers use
it as one namespace (codec.Query, codec.ErrorResponse). The frontend half (decoding, with the
limits) and the backend half (encoding) are separate sections below.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from dpproxy.errors import CharacterNotInRepertoire, DPProxyError, ProtocolViolation
from dpproxy.wire.types import WireColumn

PROTOCOL_3_0 = 3 << 16
SSL_REQUEST_CODE = 80877103
GSSENC_REQUEST_CODE = 80877104
CANCEL_REQUEST_CODE = 80877102

# PostgreSQL's own limit on a startup packet (MAX_STARTUP_PACKET_LENGTH).
MAX_STARTUP_LENGTH = 10_000
# Before authentication a peer may only send password and SASL messages (PG_MAX_AUTH_TOKEN_LENGTH).
MAX_AUTH_MESSAGE_LENGTH = 65_535
DEFAULT_MAX_MESSAGE_LENGTH = 16 * 1024 * 1024
MAX_PARAMETERS = 65_535


# ---------------------------------------------------------------------------------------------
# Frontend messages
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StartupMessage:
    protocol: int  # major << 16 | minor
    parameters: Mapping[str, str]

    @property
    def major(self) -> int:
        return self.protocol >> 16

    @property
    def minor(self) -> int:
        return self.protocol & 0xFFFF


@dataclass(frozen=True, slots=True)
class SSLRequest:
    pass


@dataclass(frozen=True, slots=True)
class GSSENCRequest:
    pass


@dataclass(frozen=True, slots=True)
class CancelRequest:
    process_id: int
    secret_key: int


@dataclass(frozen=True, slots=True)
class Query:
    sql: str


@dataclass(frozen=True, slots=True)
class Parse:
    statement: str
    sql: str
    parameter_oids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Bind:
    portal: str
    statement: str
    parameter_formats: tuple[int, ...]
    parameters: tuple[bytes | None, ...]
    result_formats: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Describe:
    kind: str  # "S" statement, "P" portal
    name: str


@dataclass(frozen=True, slots=True)
class Execute:
    portal: str
    max_rows: int  # 0: all


@dataclass(frozen=True, slots=True)
class Close:
    kind: str  # "S" statement, "P" portal
    name: str


@dataclass(frozen=True, slots=True)
class Sync:
    pass


@dataclass(frozen=True, slots=True)
class Flush:
    pass


@dataclass(frozen=True, slots=True)
class Terminate:
    pass


@dataclass(frozen=True, slots=True)
class AuthenticationResponse:
    """A 'p' message: PasswordMessage, SASLInitialResponse or SASLResponse. Which one it is depends
    on the authentication request the server sent, so its body is read by the methods below."""

    data: bytes

    def password(self) -> str:
        if not self.data.endswith(b"\x00") or b"\x00" in self.data[:-1]:
            raise ProtocolViolation("invalid password packet")
        try:
            return self.data[:-1].decode()
        except UnicodeDecodeError:
            raise ProtocolViolation("invalid password packet: not UTF-8") from None

    def sasl_initial(self) -> tuple[str, bytes | None]:
        reader = _Reader(self.data, "SASLInitialResponse")
        mechanism = reader.cstring()
        length = reader.int32()
        if length == -1:
            response = None
        elif length < 0:
            raise ProtocolViolation("invalid SASLInitialResponse length")
        else:
            response = reader.bytes(length)
        reader.end()
        return mechanism, response


@dataclass(frozen=True, slots=True)
class CopyData:
    data: bytes


@dataclass(frozen=True, slots=True)
class CopyDone:
    pass


@dataclass(frozen=True, slots=True)
class CopyFail:
    message: str


@dataclass(frozen=True, slots=True)
class FunctionCall:
    function_oid: int


@dataclass(frozen=True, slots=True)
class Undecodable:
    """A well-framed message whose text is not valid UTF-8: answered with an error, not a close."""

    type_code: str
    error: DPProxyError


FrontendMessage = (
    StartupMessage
    | SSLRequest
    | GSSENCRequest
    | CancelRequest
    | Query
    | Parse
    | Bind
    | Describe
    | Execute
    | Close
    | Sync
    | Flush
    | Terminate
    | AuthenticationResponse
    | CopyData
    | CopyDone
    | CopyFail
    | FunctionCall
    | Undecodable
)

# Messages of the extended query protocol: after an error, they are skipped until Sync.
EXTENDED = (Parse, Bind, Describe, Execute, Close, Flush)


class _Reader:
    __slots__ = ("_data", "_pos", "_what")

    def __init__(self, data: bytes, what: str) -> None:
        self._data = data
        self._pos = 0
        self._what = what

    def _short(self) -> ProtocolViolation:
        return ProtocolViolation(f"invalid {self._what} message: it ends too early")

    def int16(self) -> int:
        if self._pos + 2 > len(self._data):
            raise self._short()
        value = struct.unpack_from("!h", self._data, self._pos)[0]
        self._pos += 2
        return value

    def int32(self) -> int:
        if self._pos + 4 > len(self._data):
            raise self._short()
        value = struct.unpack_from("!i", self._data, self._pos)[0]
        self._pos += 4
        return value

    def bytes(self, length: int) -> bytes:
        if length < 0 or self._pos + length > len(self._data):
            raise self._short()
        value = self._data[self._pos : self._pos + length]
        self._pos += length
        return value

    def cstring(self) -> str:
        end = self._data.find(b"\x00", self._pos)
        if end < 0:
            raise ProtocolViolation(f"invalid {self._what} message: a string is not terminated")
        raw = self._data[self._pos : end]
        self._pos = end + 1
        try:
            return raw.decode()
        except UnicodeDecodeError:
            raise CharacterNotInRepertoire('invalid byte sequence for encoding "UTF8"') from None

    def count(self, what: str) -> int:
        n = self.int16()
        if n < 0:
            raise ProtocolViolation(f"invalid {self._what} message: negative number of {what}")
        return n

    def end(self) -> None:
        if self._pos != len(self._data):
            raise ProtocolViolation(f"invalid {self._what} message: unexpected data at its end")


def _formats(reader: _Reader, what: str) -> tuple[int, ...]:
    codes = tuple(reader.int16() for _ in range(reader.count(what)))
    if any(code not in (0, 1) for code in codes):
        bad = next(code for code in codes if code not in (0, 1))
        raise ProtocolViolation(f"unsupported format code: {bad}")
    return codes


def _parse(body: bytes) -> Parse:
    r = _Reader(body, "Parse")
    name, sql = r.cstring(), r.cstring()
    oids = tuple(r.int32() & 0xFFFFFFFF for _ in range(r.count("parameter types")))
    r.end()
    return Parse(name, sql, oids)


def _bind(body: bytes) -> Bind:
    r = _Reader(body, "Bind")
    portal, statement = r.cstring(), r.cstring()
    formats = _formats(r, "parameter formats")
    values: list[bytes | None] = []
    for _ in range(r.count("parameters")):
        length = r.int32()
        values.append(None if length == -1 else r.bytes(length))
    result_formats = _formats(r, "result formats")
    r.end()
    return Bind(portal, statement, formats, tuple(values), result_formats)


def _describe_or_close(body: bytes, what: str) -> tuple[str, str]:
    r = _Reader(body, what)
    kind = r.bytes(1)
    if kind not in (b"S", b"P"):
        raise ProtocolViolation(f"invalid {what} message subtype {kind[:1]!r}")
    name = r.cstring()
    r.end()
    return kind.decode(), name


def _execute(body: bytes) -> Execute:
    r = _Reader(body, "Execute")
    portal, max_rows = r.cstring(), r.int32()
    r.end()
    return Execute(portal, max(0, max_rows))


def _query(body: bytes) -> Query:
    r = _Reader(body, "Query")
    sql = r.cstring()
    r.end()
    return Query(sql)


def _empty(body: bytes, message: object, what: str) -> object:
    if body:
        raise ProtocolViolation(f"invalid {what} message: unexpected data")
    return message


def _function_call(body: bytes) -> FunctionCall:
    r = _Reader(body, "FunctionCall")
    return FunctionCall(r.int32() & 0xFFFFFFFF)


def _copy_fail(body: bytes) -> CopyFail:
    return CopyFail(_Reader(body, "CopyFail").cstring())


_SYNC, _FLUSH, _TERMINATE, _COPY_DONE = Sync(), Flush(), Terminate(), CopyDone()

_DECODERS = {
    ord("Q"): _query,
    ord("P"): _parse,
    ord("B"): _bind,
    ord("D"): lambda body: Describe(*_describe_or_close(body, "Describe")),
    ord("E"): _execute,
    ord("C"): lambda body: Close(*_describe_or_close(body, "Close")),
    ord("S"): lambda body: _empty(body, _SYNC, "Sync"),
    ord("H"): lambda body: _empty(body, _FLUSH, "Flush"),
    ord("X"): lambda body: _empty(body, _TERMINATE, "Terminate"),
    ord("p"): AuthenticationResponse,
    ord("d"): CopyData,
    ord("c"): lambda body: _empty(body, _COPY_DONE, "CopyDone"),
    ord("f"): _copy_fail,
    ord("F"): _function_call,
}


def decode_startup(body: bytes) -> StartupMessage | SSLRequest | GSSENCRequest | CancelRequest:
    """The first packet of a connection (no type byte), without its length word."""
    if len(body) < 4:
        raise ProtocolViolation("invalid length of startup packet")
    (code,) = struct.unpack_from("!i", body)
    if code in (SSL_REQUEST_CODE, GSSENC_REQUEST_CODE):
        if len(body) != 4:
            raise ProtocolViolation("invalid length of SSL/GSSAPI negotiation packet")
        return SSLRequest() if code == SSL_REQUEST_CODE else GSSENCRequest()
    if code == CANCEL_REQUEST_CODE:
        if len(body) != 12:
            raise ProtocolViolation("invalid length of cancel request packet")
        pid, key = struct.unpack_from("!ii", body, 4)
        return CancelRequest(pid, key)
    if code >> 16 != 3:
        # Another protocol version: the body may not be key/value pairs; the session rejects it.
        return StartupMessage(code, {})
    # name\0value\0 … name\0value\0 \0
    rest = body[4:]
    if not rest.endswith(b"\x00"):
        raise ProtocolViolation("invalid startup packet layout: expected terminator as last byte")
    parts = rest[:-1].split(b"\x00")
    if parts[-1] != b"" or len(parts) % 2 == 0:
        raise ProtocolViolation("invalid startup packet layout: a parameter has no value")
    parameters: dict[str, str] = {}
    try:
        for i in range(0, len(parts) - 1, 2):
            key = parts[i].decode()
            if not key:
                raise ProtocolViolation("invalid startup packet layout: an empty parameter name")
            parameters[key] = parts[i + 1].decode()
    except UnicodeDecodeError:
        raise ProtocolViolation("invalid startup packet: parameters must be UTF-8") from None
    return StartupMessage(code, parameters)


class FrontendDecoder:
    """Cuts a byte stream into frontend messages. Feed it bytes, then take messages until None.

    The first packet has no type byte (`startup` is True until `startup_done()`); every later
    message is a type byte and a length word that counts itself. `max_length` bounds a message's
    length word; the server raises it once the peer has authenticated.
    """

    __slots__ = ("_buffer", "_pos", "max_length", "startup")

    def __init__(self, max_length: int = MAX_STARTUP_LENGTH) -> None:
        self._buffer = bytearray()
        self._pos = 0
        self.max_length = max_length
        self.startup = True

    def feed(self, data: bytes) -> None:
        if self._pos and self._pos == len(self._buffer):
            self._buffer.clear()
            self._pos = 0
        elif self._pos > 65536:
            del self._buffer[: self._pos]
            self._pos = 0
        self._buffer += data

    @property
    def pending(self) -> int:
        """Bytes received and not yet returned as messages."""
        return len(self._buffer) - self._pos

    def next_message(self) -> FrontendMessage | None:
        buffer, pos = self._buffer, self._pos
        if self.startup:
            if len(buffer) - pos < 4:
                return None
            (length,) = struct.unpack_from("!i", buffer, pos)
            if length < 8 or length > MAX_STARTUP_LENGTH:
                raise ProtocolViolation("invalid length of startup packet")
            if len(buffer) - pos < length:
                return None
            body = bytes(buffer[pos + 4 : pos + length])
            self._pos = pos + length
            return decode_startup(body)
        if len(buffer) - pos < 5:
            return None
        type_code = buffer[pos]
        (length,) = struct.unpack_from("!i", buffer, pos + 1)
        if length < 4:
            raise ProtocolViolation(f"invalid message length {length}")
        if length > self.max_length:
            raise ProtocolViolation(
                f"message of {length} bytes is larger than the limit of {self.max_length} bytes"
            )
        decode = _DECODERS.get(type_code)
        if decode is None:
            raise ProtocolViolation(f"invalid frontend message type {type_code}")
        if len(buffer) - pos < length + 1:
            return None
        body = bytes(buffer[pos + 5 : pos + 1 + length])
        self._pos = pos + 1 + length
        try:
            return decode(body)  # type: ignore[no-any-return]
        except CharacterNotInRepertoire as error:
            return Undecodable(chr(type_code), error)


# ---------------------------------------------------------------------------------------------
# Backend messages
# ---------------------------------------------------------------------------------------------


def _frame(type_code: bytes, body: bytes) -> bytes:
    return type_code + struct.pack("!i", len(body) + 4) + body


def _cstr(text: str) -> bytes:
    return text.encode() + b"\x00"


class BackendMessage:
    """A message to the client; `encode()` gives its bytes."""

    __slots__ = ()

    def encode(self) -> bytes:
        raise NotImplementedError


@dataclass(frozen=True, slots=True)
class AuthenticationOk(BackendMessage):
    def encode(self) -> bytes:
        return b"R\x00\x00\x00\x08\x00\x00\x00\x00"


@dataclass(frozen=True, slots=True)
class AuthenticationCleartextPassword(BackendMessage):
    def encode(self) -> bytes:
        return b"R\x00\x00\x00\x08\x00\x00\x00\x03"


@dataclass(frozen=True, slots=True)
class AuthenticationMD5Password(BackendMessage):
    salt: bytes

    def encode(self) -> bytes:
        return _frame(b"R", struct.pack("!i", 5) + self.salt)


@dataclass(frozen=True, slots=True)
class AuthenticationSASL(BackendMessage):
    mechanisms: tuple[str, ...]

    def encode(self) -> bytes:
        return _frame(b"R", struct.pack("!i", 10) + b"".join(_cstr(m) for m in self.mechanisms) + b"\x00")


@dataclass(frozen=True, slots=True)
class AuthenticationSASLContinue(BackendMessage):
    data: bytes

    def encode(self) -> bytes:
        return _frame(b"R", struct.pack("!i", 11) + self.data)


@dataclass(frozen=True, slots=True)
class AuthenticationSASLFinal(BackendMessage):
    data: bytes

    def encode(self) -> bytes:
        return _frame(b"R", struct.pack("!i", 12) + self.data)


@dataclass(frozen=True, slots=True)
class ParameterStatus(BackendMessage):
    name: str
    value: str

    def encode(self) -> bytes:
        return _frame(b"S", _cstr(self.name) + _cstr(self.value))


@dataclass(frozen=True, slots=True)
class BackendKeyData(BackendMessage):
    process_id: int
    secret_key: int

    def encode(self) -> bytes:
        return _frame(b"K", struct.pack("!ii", self.process_id, self.secret_key))


@dataclass(frozen=True, slots=True)
class NegotiateProtocolVersion(BackendMessage):
    newest_minor: int
    unrecognized_options: tuple[str, ...]

    def encode(self) -> bytes:
        body = struct.pack("!ii", self.newest_minor, len(self.unrecognized_options))
        return _frame(b"v", body + b"".join(_cstr(o) for o in self.unrecognized_options))


@dataclass(frozen=True, slots=True)
class ReadyForQuery(BackendMessage):
    status: str  # I, T or E

    def encode(self) -> bytes:
        return b"Z\x00\x00\x00\x05" + self.status.encode()


@dataclass(frozen=True, slots=True)
class RowDescription(BackendMessage):
    columns: tuple[WireColumn, ...]
    formats: tuple[int, ...]  # one per column

    def encode(self) -> bytes:
        parts = [struct.pack("!h", len(self.columns))]
        for column, fmt in zip(self.columns, self.formats, strict=True):
            parts.append(_cstr(column.name))
            parts.append(
                struct.pack(
                    "!IhIhih",
                    column.table_oid,
                    column.column_number,
                    column.type_oid,
                    column.type_size,
                    column.type_modifier,
                    fmt,
                )
            )
        return _frame(b"T", b"".join(parts))


_PACK_I = struct.Struct("!i").pack
_NULL_CELL = b"\xff\xff\xff\xff"


@dataclass(frozen=True, slots=True)
class DataRow(BackendMessage):
    cells: Sequence[bytes | None]  # each column's bytes, already encoded; None for NULL

    def body(self) -> bytes:
        """The field count, then each cell's length (-1 for NULL) and bytes: also a binary COPY tuple."""
        parts = [struct.pack("!h", len(self.cells))]
        for cell in self.cells:
            if cell is None:
                parts.append(_NULL_CELL)
            else:
                parts.append(_PACK_I(len(cell)))
                parts.append(cell)
        return b"".join(parts)

    def encode(self) -> bytes:
        body = self.body()
        return b"D" + _PACK_I(len(body) + 4) + body


@dataclass(frozen=True, slots=True)
class CommandComplete(BackendMessage):
    tag: str

    def encode(self) -> bytes:
        return _frame(b"C", _cstr(self.tag))


@dataclass(frozen=True, slots=True)
class EmptyQueryResponse(BackendMessage):
    def encode(self) -> bytes:
        return b"I\x00\x00\x00\x04"


@dataclass(frozen=True, slots=True)
class ParseComplete(BackendMessage):
    def encode(self) -> bytes:
        return b"1\x00\x00\x00\x04"


@dataclass(frozen=True, slots=True)
class BindComplete(BackendMessage):
    def encode(self) -> bytes:
        return b"2\x00\x00\x00\x04"


@dataclass(frozen=True, slots=True)
class CloseComplete(BackendMessage):
    def encode(self) -> bytes:
        return b"3\x00\x00\x00\x04"


@dataclass(frozen=True, slots=True)
class NoData(BackendMessage):
    def encode(self) -> bytes:
        return b"n\x00\x00\x00\x04"


@dataclass(frozen=True, slots=True)
class PortalSuspended(BackendMessage):
    def encode(self) -> bytes:
        return b"s\x00\x00\x00\x04"


@dataclass(frozen=True, slots=True)
class CopyOutResponse(BackendMessage):
    """The start of COPY … TO STDOUT: the overall format, 0 (text, which CSV is too) or 1 (binary), then
    the column count and one format code per column, all the overall one (as PostgreSQL sends them)."""

    columns: int
    format: int = 0

    def encode(self) -> bytes:
        codes = [self.format] * self.columns
        return _frame(b"H", struct.pack(f"!bh{self.columns}h", self.format, self.columns, *codes))


@dataclass(frozen=True, slots=True)
class CopyOutData(BackendMessage):
    """One CopyData message of COPY … TO STDOUT: a row (or the header line), newline included; in
    binary, a tuple (the first one after the file header, the trailer alone)."""

    data: bytes

    def encode(self) -> bytes:
        return _frame(b"d", self.data)


@dataclass(frozen=True, slots=True)
class CopyOutDone(BackendMessage):
    def encode(self) -> bytes:
        return b"c\x00\x00\x00\x04"


@dataclass(frozen=True, slots=True)
class ParameterDescription(BackendMessage):
    type_oids: tuple[int, ...]

    def encode(self) -> bytes:
        return _frame(b"t", struct.pack(f"!h{len(self.type_oids)}I", len(self.type_oids), *self.type_oids))


@dataclass(frozen=True, slots=True)
class ErrorResponse(BackendMessage):
    """ErrorResponse ('E') or, with `notice`, NoticeResponse ('N'): severity, SQLSTATE, message…"""

    severity: str  # ERROR, FATAL, PANIC / WARNING, NOTICE, DEBUG, INFO, LOG
    code: str
    message: str
    detail: str | None = None
    hint: str | None = None
    position: int | None = None

    @property
    def notice(self) -> bool:
        return self.severity not in ("ERROR", "FATAL", "PANIC")

    def encode(self) -> bytes:
        fields = [b"S" + _cstr(self.severity), b"V" + _cstr(self.severity), b"C" + _cstr(self.code)]
        fields.append(b"M" + _cstr(self.message))
        if self.detail:
            fields.append(b"D" + _cstr(self.detail))
        if self.hint:
            fields.append(b"H" + _cstr(self.hint))
        if self.position is not None:
            fields.append(b"P" + _cstr(str(self.position)))
        return _frame(b"N" if self.notice else b"E", b"".join(fields) + b"\x00")


def notice(
    message: str, *, severity: str = "NOTICE", code: str = "00000", hint: str | None = None
) -> ErrorResponse:
    return ErrorResponse(severity, code, message, hint=hint)


def error_from(error: DPProxyError, *, severity: str = "ERROR") -> ErrorResponse:
    return ErrorResponse(severity, error.sqlstate, error.message, hint=error.hint, position=error.position)


def encode_all(messages: Iterable[BackendMessage]) -> bytes:
    return b"".join(m.encode() for m in messages)
