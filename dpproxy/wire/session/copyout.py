"""COPY … TO STDOUT's output: released rows written as PostgreSQL's COPY writes them, in text, CSV
or binary.

Text and CSV: each row becomes one CopyData payload (newline included), values in the session's
text output format, escaped as PostgreSQL's CopyAttributeOutText / CopyAttributeOutCSV escape them;
HEADER adds the column names as the first line. Binary: PostgreSQL's file format (signature, flags,
header extension length), then each row as a tuple — a field count, and per field its length (-1 for
NULL) and its value in the binary format binary DataRows carry, by the same encoders, since a tuple
is a DataRow's body — and the trailer (-1). The payloads are split as PostgreSQL's CopyTo splits
them: the header goes with the first tuple, the trailer alone (with the header when there is no row).

The rows are those the statement already released (a private query's noisy answer): this module
only formats them. It never runs SQL or touches a socket.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from dpproxy.errors import UndefinedColumn
from dpproxy.wire.codec import DataRow
from dpproxy.wire.router.statement import CopyOptions
from dpproxy.wire.types import TextFormat, WireColumn, encoder

# The binary file format's header: the signature, flags (no OIDs) and the header extension's
# length (none); and its trailer, a field count of -1.
BINARY_HEADER = b"PGCOPY\n\xff\r\n\x00" + struct.pack("!ii", 0, 0)
BINARY_TRAILER = struct.pack("!h", -1)

# CopyAttributeOutText's escapes: control characters by name, and the backslash itself.
_TEXT_ESCAPES = {
    "\\": "\\\\",
    "\b": "\\b",
    "\f": "\\f",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
    "\v": "\\v",
}


def _text_field(value: str, delimiter: str) -> str:
    if not any(c in _TEXT_ESCAPES or c == delimiter for c in value):
        return value
    out = []
    for c in value:
        escaped = _TEXT_ESCAPES.get(c)
        if escaped is not None:
            out.append(escaped)
        elif c == delimiter:
            out.append("\\" + c)
        else:
            out.append(c)
    return "".join(out)


def _csv_field(value: str, options: CopyOptions, *, force: bool, single: bool) -> str:
    quote, escape = options.quote, options.escape
    use_quote = (
        force
        or value == options.null
        or (single and value == "\\.")
        or any(c in (options.delimiter, quote, "\n", "\r") for c in value)
    )
    if not use_quote:
        return value
    body = "".join(escape + c if c in (quote, escape) else c for c in value)
    return quote + body + quote


def copy_lines(
    columns: Sequence[WireColumn],
    rows: Sequence[Sequence[object]],
    options: CopyOptions,
    text_format: TextFormat,
) -> list[bytes]:
    """The CopyData payloads of COPY … TO STDOUT: the header line if asked for, then one per row."""
    if options.format == "binary":
        return _binary_payloads(columns, rows, text_format)
    names = [c.name for c in columns]
    unknown = [n for n in options.force_quote if n not in names]
    if unknown:
        raise UndefinedColumn(
            f'FORCE_QUOTE column "{unknown[0]}" not referenced by COPY',
            hint="name output columns of the query in FORCE_QUOTE, or use FORCE_QUOTE *",
        )
    csv = options.format == "csv"
    single = len(columns) == 1
    forced = [options.force_quote_all or n in options.force_quote for n in names]
    encoders = [encoder(c.type_oid, 0, text_format) for c in columns]
    lines: list[bytes] = []

    def field(text: str, index: int, *, header: bool = False) -> str:
        if csv:
            return _csv_field(text, options, force=forced[index] and not header, single=single)
        return _text_field(text, options.delimiter)

    if options.header:
        lines.append(
            (options.delimiter.join(field(n, i, header=True) for i, n in enumerate(names)) + "\n").encode()
        )
    for row in rows:
        fields = []
        for i, (encode, value) in enumerate(zip(encoders, row, strict=True)):
            if value is None:
                fields.append(options.null)
            else:
                fields.append(field(encode(value).decode(), i))
        lines.append((options.delimiter.join(fields) + "\n").encode())
    return lines


def _binary_payloads(
    columns: Sequence[WireColumn], rows: Sequence[Sequence[object]], text_format: TextFormat
) -> list[bytes]:
    encoders = [encoder(c.type_oid, 1, text_format) for c in columns]
    tuples = [
        DataRow([None if v is None else encode(v) for encode, v in zip(encoders, row, strict=True)]).body()
        for row in rows
    ]
    if not tuples:
        return [BINARY_HEADER + BINARY_TRAILER]
    return [BINARY_HEADER + tuples[0], *tuples[1:], BINARY_TRAILER]
