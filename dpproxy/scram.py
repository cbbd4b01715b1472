"""SCRAM-SHA-256 password verifiers in PostgreSQL's text format (RFC 5802, RFC 7677).

This module owns making, parsing and checking verifiers of the form
``SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>`` (base64 fields), the same text
PostgreSQL stores in ``pg_authid.rolpassword``, so a verifier can be copied between the two.
The wire server authenticates clients against the `ScramVerifier` fields.

It must never store, log or put into an error message a plaintext password, nor the fields of a
verifier: a verifier is enough to mount an offline guessing attack, so messages say which part is
malformed, never what it contains.

Passwords are normalised with SASLprep (RFC 4013, built on the stdlib `stringprep` tables) the way
PostgreSQL does it: when the password is not valid SASLprep input (prohibited characters, bad
bidirectional text), the raw UTF-8 bytes are used instead of failing, so that any password
PostgreSQL accepts is accepted here and yields the same keys.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import re
import stringprep
import unicodedata
from dataclasses import dataclass

MECHANISM = "SCRAM-SHA-256"
DEFAULT_ITERATIONS = 4096  # PostgreSQL's default (scram_iterations) and RFC 7677's minimum advice
MIN_ITERATIONS = 4096
SALT_LENGTH = 16  # bytes, as PostgreSQL generates them
KEY_LENGTH = hashlib.sha256().digest_size

_VERIFIER = re.compile(
    r"SCRAM-SHA-256\$(?P<iterations>[0-9]+):(?P<salt>[^$:]+)\$(?P<stored>[^$:]+):(?P<server>[^$:]+)"
)


@dataclass(frozen=True)
class ScramVerifier:
    """What a server needs to check a SCRAM-SHA-256 client proof, and nothing that reveals the password."""

    iterations: int
    salt: bytes
    stored_key: bytes
    server_key: bytes

    def __post_init__(self) -> None:
        if self.iterations < 1:
            raise ValueError("SCRAM verifier: the iteration count must be at least 1")
        if not self.salt:
            raise ValueError("SCRAM verifier: the salt must not be empty")
        if len(self.stored_key) != KEY_LENGTH or len(self.server_key) != KEY_LENGTH:
            raise ValueError(f"SCRAM verifier: StoredKey and ServerKey must be {KEY_LENGTH} bytes each")

    def __repr__(self) -> str:
        # Keep the keys out of logs and tracebacks.
        return f"ScramVerifier(iterations={self.iterations}, salt=<{len(self.salt)} bytes>, keys=<hidden>)"

    def to_text(self) -> str:
        """The verifier in PostgreSQL's format."""
        return (
            f"{MECHANISM}${self.iterations}:{_b64(self.salt)}${_b64(self.stored_key)}:{_b64(self.server_key)}"
        )

    def matches(self, password: str) -> bool:
        """True when `password` is the one this verifier was made from (for CLI and tests)."""
        salted = salted_password(password, self.salt, self.iterations)
        stored_key, server_key = _keys(salted)
        return hmac.compare_digest(stored_key, self.stored_key) and hmac.compare_digest(
            server_key, self.server_key
        )


def make_verifier(password: str, *, iterations: int = DEFAULT_ITERATIONS, salt: bytes | None = None) -> str:
    """A fresh SCRAM-SHA-256 verifier for `password`, in PostgreSQL's text format.

    A random 16-byte salt is drawn from the OS unless `salt` is given (tests, known vectors).
    """
    if not isinstance(password, str) or not password:
        raise ValueError("the password must be a non-empty string")
    if iterations < MIN_ITERATIONS:
        raise ValueError(f"the iteration count must be at least {MIN_ITERATIONS} (RFC 7677)")
    if salt is None:
        salt = os.urandom(SALT_LENGTH)
    if not salt:
        raise ValueError("the salt must not be empty")
    stored_key, server_key = _keys(salted_password(password, salt, iterations))
    return ScramVerifier(iterations, salt, stored_key, server_key).to_text()


def parse_verifier(text: str) -> ScramVerifier:
    """Parse PostgreSQL's verifier text; raise ValueError (without echoing the text) when malformed."""
    if not isinstance(text, str):
        raise ValueError("a SCRAM verifier must be a string")
    match = _VERIFIER.fullmatch(text.strip())
    if match is None:
        raise ValueError(
            f"not a {MECHANISM} verifier: expected {MECHANISM}$<iterations>:<salt>$<StoredKey>:<ServerKey>"
        )
    iterations = int(match["iterations"])
    fields = {}
    for part in ("salt", "stored", "server"):
        try:
            fields[part] = base64.b64decode(match[part], validate=True)
        except (binascii.Error, ValueError):
            name = {"salt": "salt", "stored": "StoredKey", "server": "ServerKey"}[part]
            raise ValueError(f"SCRAM verifier: the {name} is not valid base64") from None
    return ScramVerifier(iterations, fields["salt"], fields["stored"], fields["server"])


def is_verifier(text: object) -> bool:
    """True when `text` is a well-formed SCRAM-SHA-256 verifier."""
    if not isinstance(text, str):
        return False
    try:
        parse_verifier(text)
    except ValueError:
        return False
    return True


def salted_password(password: str, salt: bytes, iterations: int) -> bytes:
    """SaltedPassword := Hi(Normalize(password), salt, i) = PBKDF2-HMAC-SHA-256 (RFC 5802 §3)."""
    return hashlib.pbkdf2_hmac("sha256", _normalize(password), salt, iterations)


def saslprep(text: str) -> str:
    """SASLprep (RFC 4013) of `text`; ValueError when the result would contain prohibited characters."""
    # 1. Map: non-ASCII spaces to SPACE, "commonly mapped to nothing" characters removed.
    mapped = "".join(" " if stringprep.in_table_c12(c) else c for c in text if not stringprep.in_table_b1(c))
    # 2. Normalise with NFKC as of Unicode 3.2, the version stringprep is defined on.
    normalized = unicodedata.ucd_3_2_0.normalize("NFKC", mapped)
    # 3. Prohibit (RFC 4013 §2.3) and reject unassigned code points (stored strings, RFC 3454 §7).
    for c in normalized:
        if (
            stringprep.in_table_c12(c)
            or stringprep.in_table_c21_c22(c)
            or stringprep.in_table_c3(c)
            or stringprep.in_table_c4(c)
            or stringprep.in_table_c5(c)
            or stringprep.in_table_c6(c)
            or stringprep.in_table_c7(c)
            or stringprep.in_table_c8(c)
            or stringprep.in_table_c9(c)
            or stringprep.in_table_a1(c)
        ):
            raise ValueError("the password contains characters SASLprep prohibits")
    # 4. Bidirectional text (RFC 3454 §6).
    if any(stringprep.in_table_d1(c) for c in normalized):
        if any(stringprep.in_table_d2(c) for c in normalized):
            raise ValueError("the password mixes left-to-right and right-to-left text")
        if not (stringprep.in_table_d1(normalized[0]) and stringprep.in_table_d1(normalized[-1])):
            raise ValueError("right-to-left text must start and end with a right-to-left character")
    return normalized


def _normalize(password: str) -> bytes:
    # PostgreSQL (src/common/saslprep.c, pg_saslprep) falls back to the raw bytes when SASLprep
    # fails; doing the same keeps verifiers interchangeable with PostgreSQL's and libpq's.
    try:
        return saslprep(password).encode("utf-8")
    except ValueError:
        return password.encode("utf-8")


def _keys(salted: bytes) -> tuple[bytes, bytes]:
    client_key = hmac.digest(salted, b"Client Key", "sha256")
    stored_key = hashlib.sha256(client_key).digest()
    server_key = hmac.digest(salted, b"Server Key", "sha256")
    return stored_key, server_key


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")
