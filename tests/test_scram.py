"""SCRAM-SHA-256 verifiers: they interoperate with a real SCRAM client and are byte-identical to
PostgreSQL's, and malformed ones are rejected without being echoed.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scramp import ScramClient, ScramException, ScramMechanism

from dpproxy.scram import is_verifier, make_verifier, parse_verifier

# A verifier for the password "pw", made once (PBKDF2 is deliberately slow).
PW_VERIFIER = make_verifier("pw")


def scram_exchange(verifier_text: str, password: str) -> None:
    """A full SCRAM-SHA-256 exchange: scramp's client against scramp's server using our verifier."""
    verifier = parse_verifier(verifier_text)

    def auth_fn(username: str) -> tuple[bytes, bytes, bytes, int]:
        return verifier.salt, verifier.stored_key, verifier.server_key, verifier.iterations

    server = ScramMechanism("SCRAM-SHA-256").make_server(auth_fn)
    client = ScramClient(["SCRAM-SHA-256"], "ann", password)
    server.set_client_first(client.get_client_first())
    client.set_server_first(server.get_server_first())
    server.set_client_final(client.get_client_final())
    client.set_server_final(server.get_server_final())  # checks the server's signature


def test_a_verifier_authenticates_a_real_scram_client():
    scram_exchange(PW_VERIFIER, "pw")
    with pytest.raises(ScramException):
        scram_exchange(PW_VERIFIER, "pw2")


def test_saslprep_matches_the_scram_client():
    # U+00AD (soft hyphen) maps to nothing and U+2168 (roman numeral nine) to "IX" under SASLprep.
    verifier = make_verifier("I\u00adX\u2168")
    scram_exchange(verifier, "IXIX")
    assert parse_verifier(verifier).matches("IXIX")


# Made by PostgreSQL 15 (CREATE ROLE ... PASSWORD with password_encryption = scram-sha-256).
POSTGRES_VERIFIERS = {
    "alice-demo": "SCRAM-SHA-256$4096:tPCPIQQJFH4AOjtF9lwD+Q==$cIIBiwGGGFpehg6CuKwRffft7TRNcZitabTOJQyZM58="
    ":YDNea870KjkKNiRDxXUgFTyqB/kf1bbBPqj1c5njeG0=",
    # SASLprep maps the soft hyphen to nothing and NFKC turns U+2168 into "IX".
    "I\u00adX\u2168": (
        "SCRAM-SHA-256$4096:zYZ2cBQB/lR6aYKP2IKnAw==$ge43CjVD/zhWiver3Zw4FFI1wsT3LIF7gxwveEs0W/Y="
        ":WWEz2I07j61ArHycoHYGiyk5HjhV1RlJ5qRg8k3/VjA="
    ),
    # A private-use character is prohibited: PostgreSQL then uses the raw bytes.
    "pri\ue000vate": (
        "SCRAM-SHA-256$4096:Fo4Q0W/NCms9+0VexVdDiQ==$JxQOrDVCsxa+s4+Zt+QkMAEcX+gqM+NczzpmMnrKA70="
        ":ljjjo0R3x+XzBsjBBQUnVIOOrs6ppaHTRLi3nJbvZvU="
    ),
    # Right-to-left text mixed with a left-to-right letter: invalid bidi, raw bytes again.
    "\u0627\u0644a": (
        "SCRAM-SHA-256$4096:x4OSXxaNPyWbKLfDcA0HJg==$zvjfRuuHWzJQlfJmZnbXMZidxnFR4xHvig8jDYNLuwI="
        ":vGaxRvNawbPs9piOcPE7gcGE8IqduWXEkjBMq7+KUs0="
    ),
}


@pytest.mark.parametrize("password", list(POSTGRES_VERIFIERS))
def test_verifiers_are_byte_identical_to_postgresql(password):
    expected = POSTGRES_VERIFIERS[password]
    assert make_verifier(password, salt=parse_verifier(expected).salt) == expected


@settings(max_examples=15)
@given(st.text(min_size=1, max_size=20))
def test_any_password_matches_its_own_verifier_only(password):
    verifier = parse_verifier(make_verifier(password))
    assert verifier.matches(password)
    assert not verifier.matches(password + "x")


@pytest.mark.parametrize(
    "text",
    [
        "hunter2",
        "md5a3556571e93b0d20722ba62be61e8c2d",
        "SCRAM-SHA-1$4096:c2FsdA==$a:b",
        "SCRAM-SHA-256$4096:c2FsdA==$!!!:abc=",
        "SCRAM-SHA-256$0:c2FsdA==$" + "A" * 43 + "=:" + "A" * 43 + "=",
        "SCRAM-SHA-256$4096:c2FsdA==$c2hvcnQ=:c2hvcnQ=",  # keys of the wrong length
    ],
)
def test_malformed_verifiers_are_rejected_without_echo(text):
    assert not is_verifier(text)
    with pytest.raises(ValueError) as info:
        parse_verifier(text)
    assert text not in str(info.value)


def test_verifier_format_and_repr():
    text = make_verifier("pw", salt=b"0123456789abcdef")
    assert text.startswith("SCRAM-SHA-256$4096:MDEyMzQ1Njc4OWFiY2RlZg==$")
    verifier = parse_verifier(text)
    assert verifier.to_text() == text and is_verifier(text)
    assert verifier.salt == b"0123456789abcdef" and len(verifier.stored_key) == 32
    assert "MDEy" not in repr(verifier) and text.split("$")[2][:10] not in repr(verifier)
    with pytest.raises(ValueError):
        make_verifier("pw", iterations=1000)
    with pytest.raises(ValueError):
        make_verifier("")
