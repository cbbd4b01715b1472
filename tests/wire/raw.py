"""Raw PostgreSQL protocol messages for the wire tests: framing helpers, a client that speaks
messages byte by byte, and readers of the fields a test checks."""

from __future__ import annotations

import socket
import struct
import sys

import scramp

from dpproxy.wire import codec
from tests.wire.proxy import ALICE, ALICE_PASSWORD


def msg(type_code: str, body: bytes = b"") -> bytes:
    return type_code.encode() + struct.pack("!i", len(body) + 4) + body


def cstr(text: str) -> bytes:
    return text.encode() + b"\x00"


def parse(name: str, sql: str, oids: tuple[int, ...] = ()) -> bytes:
    return msg("P", cstr(name) + cstr(sql) + struct.pack(f"!h{len(oids)}I", len(oids), *oids))


def bind(
    portal: str, statement: str, params: tuple[bytes | None, ...] = (), result_formats: tuple[int, ...] = ()
) -> bytes:
    body = cstr(portal) + cstr(statement) + struct.pack("!h", 0) + struct.pack("!h", len(params))
    for p in params:
        body += struct.pack("!i", -1) if p is None else struct.pack("!i", len(p)) + p
    return msg("B", body + struct.pack(f"!h{len(result_formats)}h", len(result_formats), *result_formats))


def describe(kind: str, name: str) -> bytes:
    return msg("D", kind.encode() + cstr(name))


def execute(portal: str, max_rows: int = 0) -> bytes:
    return msg("E", cstr(portal) + struct.pack("!i", max_rows))


SYNC = msg("S")


def error_fields(body: bytes) -> dict[str, str]:
    fields = {}
    for part in body.split(b"\x00"):
        if part:
            fields[chr(part[0])] = part[1:].decode()
    return fields


def row_names(body: bytes) -> list[str]:
    (count,) = struct.unpack_from("!h", body)
    names, pos = [], 2
    for _ in range(count):
        end = body.index(b"\x00", pos)
        names.append(body[pos:end].decode())
        pos = end + 1 + 18
    return names


def data_row(body: bytes) -> list[bytes | None]:
    (count,) = struct.unpack_from("!h", body)
    cells: list[bytes | None] = []
    pos = 2
    for _ in range(count):
        (length,) = struct.unpack_from("!i", body, pos)
        pos += 4
        if length < 0:
            cells.append(None)
        else:
            cells.append(body[pos : pos + length])
            pos += length
    return cells


class RawClient:
    """A protocol-level client: sends bytes, reads (type, body) messages."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=20)
        self.buffer = b""
        self.parameters: dict[str, str] = {}
        self.key: tuple[int, int] | None = None

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()

    def send(self, *messages: bytes) -> None:
        self.sock.sendall(b"".join(messages))

    def startup(self, user: str, **parameters: str) -> None:
        params = {"user": user, "database": "demo", **parameters}
        body = (
            struct.pack("!i", codec.PROTOCOL_3_0)
            + b"".join(cstr(k) + cstr(v) for k, v in params.items())
            + b"\x00"
        )
        self.send(struct.pack("!i", len(body) + 4) + body)

    def _fill(self) -> bool:
        data = self.sock.recv(65536)
        if not data:
            return False
        self.buffer += data
        return True

    def read(self) -> tuple[str, bytes]:
        while len(self.buffer) < 5 or len(self.buffer) < 1 + struct.unpack_from("!i", self.buffer, 1)[0]:
            if not self._fill():
                raise ConnectionError("closed by the server")
        length = struct.unpack_from("!i", self.buffer, 1)[0]
        kind, body = chr(self.buffer[0]), self.buffer[5 : 1 + length]
        self.buffer = self.buffer[1 + length :]
        return kind, body

    def read_until(self, kind: str = "Z") -> list[tuple[str, bytes]]:
        messages = []
        while True:
            message = self.read()
            messages.append(message)
            if message[0] == kind:
                return messages

    def closed(self) -> bool:
        """True when the server closed the connection (after any messages still buffered)."""
        try:
            while self._fill():
                pass
        except (ConnectionResetError, TimeoutError):
            return not isinstance(sys.exc_info()[1], TimeoutError)
        return True

    def login(self, user: str = ALICE, password: str = ALICE_PASSWORD) -> list[tuple[str, bytes]]:
        self.startup(user)
        kind, body = self.read()
        assert kind == "R" and struct.unpack("!i", body[:4])[0] == 10
        client = scramp.ScramClient(["SCRAM-SHA-256"], user, password)
        first = client.get_client_first().encode()
        self.send(msg("p", cstr("SCRAM-SHA-256") + struct.pack("!i", len(first)) + first))
        kind, body = self.read()
        assert kind == "R" and struct.unpack("!i", body[:4])[0] == 11
        client.set_server_first(body[4:].decode())
        self.send(msg("p", client.get_client_final().encode()))
        kind, body = self.read()
        assert kind == "R" and struct.unpack("!i", body[:4])[0] == 12
        client.set_server_final(body[4:].decode())
        messages = self.read_until("Z")
        for kind, body in messages:
            if kind == "S":
                name, value, _ = body.split(b"\x00")
                self.parameters[name.decode()] = value.decode()
            elif kind == "K":
                self.key = struct.unpack("!ii", body)
        return messages


def kinds(messages: list[tuple[str, bytes]]) -> str:
    return "".join(k for k, _ in messages)
