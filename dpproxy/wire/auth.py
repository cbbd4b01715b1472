"""Password authentication of a connection: SCRAM-SHA-256 (RFC 5802, RFC 7677), and, only when the
policy's `server.auth_methods` enables them, cleartext `password` and `md5`.

This module owns the server side of each exchange against the credentials of the policy (SCRAM
verifiers, md5 hashes). Written by hand rather than with `scramp`: scramp's server refuses the empty
user name libpq sends in its SCRAM messages (PostgreSQL takes the user from the startup packet), and
refuses verifiers below its own iteration floor.

It must never tell a client whether an analyst exists or has a password: an unknown analyst, one
without a credential and a wrong password all go through the same exchange (a mock one, with a
salt and iteration count that look real and are stable per user name) and end in the same error.
It never logs or returns a password, a verifier or a proof.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import re
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from dpproxy import scram
from dpproxy.errors import AuthenticationFailed, NotSupported, ProtocolViolation, TLSRequired
from dpproxy.policy import AnalystPolicy, AuthMethod, Policy
from dpproxy.scram import ScramVerifier
from dpproxy.wire import codec
from dpproxy.wire.codec import AuthenticationResponse, BackendMessage

RunBlocking = Callable[..., Awaitable[Any]]

SCRAM_MECHANISM = scram.MECHANISM
_NONCE_BYTES = 18  # PostgreSQL's SCRAM_RAW_NONCE_LEN
_PRINTABLE_NONCE = re.compile(r"[\x21-\x2b\x2d-\x7e]+")  # printable ASCII except ','


@dataclass(frozen=True)
class AuthStep:
    """What an exchange answers to one client message: a reply, and whether it has finished."""

    reply: BackendMessage | None = None
    finished: bool = False  # True: the exchange ended, `authenticated` says how


class AuthExchange(ABC):
    """One authentication exchange with one client. `start()` gives the request to send; each
    AuthenticationResponse of the client goes to `respond`, until a step says `finished`."""

    method: AuthMethod

    def __init__(self, user: str, *, mock: bool) -> None:
        self.user = user
        self.authenticated = False
        self._mock = mock  # against a mock credential: the exchange runs in full and always fails

    @abstractmethod
    def start(self) -> BackendMessage: ...

    @abstractmethod
    async def respond(self, message: AuthenticationResponse, run_blocking: RunBlocking) -> AuthStep: ...

    def failure(self) -> AuthenticationFailed:
        return AuthenticationFailed(self.user)


class _VerifierExchange(AuthExchange):
    """An exchange checked against the analyst's SCRAM verifier (SCRAM-SHA-256 and cleartext)."""

    def __init__(self, user: str, verifier: ScramVerifier, *, mock: bool) -> None:
        super().__init__(user, mock=mock)
        self._verifier = verifier


class ScramExchange(_VerifierExchange):
    """SCRAM-SHA-256 without channel binding, as PostgreSQL's auth-scram.c does it."""

    method = AuthMethod.SCRAM_SHA_256

    def __init__(self, user: str, verifier: ScramVerifier, *, mock: bool) -> None:
        super().__init__(user, verifier, mock=mock)
        self._stage = 0
        self._gs2_header = ""
        self._client_first_bare = ""
        self._server_first = ""
        self._nonce = ""

    def start(self) -> BackendMessage:
        return codec.AuthenticationSASL((SCRAM_MECHANISM,))

    async def respond(self, message: AuthenticationResponse, run_blocking: RunBlocking) -> AuthStep:
        if self._stage == 0:
            self._stage = 1
            mechanism, response = message.sasl_initial()
            if mechanism != SCRAM_MECHANISM:
                raise ProtocolViolation("client selected an invalid SASL authentication mechanism")
            if response is None:
                raise ProtocolViolation("malformed SCRAM message: the initial response is missing")
            return AuthStep(codec.AuthenticationSASLContinue(self._client_first(response).encode()))
        if self._stage == 1:
            self._stage = 2
            return self._client_final(message.data)
        raise ProtocolViolation("unexpected SASL message after the exchange finished")

    def _client_first(self, response: bytes) -> str:
        try:
            text = response.decode("ascii")
        except UnicodeDecodeError:
            # The user name may be UTF-8; only it, and it is ignored.
            text = response.decode("utf-8", errors="replace")
        # gs2-header: channel-binding flag, authzid, then client-first-message-bare.
        parts = text.split(",", 2)
        if len(parts) != 3:
            raise ProtocolViolation("malformed SCRAM message: expected a GS2 header")
        flag, authzid, bare = parts
        if flag.startswith("p="):
            raise ProtocolViolation(
                "malformed SCRAM message: the client requires channel binding, "
                "which this server does not offer (use SCRAM-SHA-256 without -PLUS)"
            )
        if flag not in ("n", "y"):
            raise ProtocolViolation("malformed SCRAM message: unexpected channel-binding flag")
        if authzid:
            raise NotSupported("client uses authorization identity, but it is not supported")
        attributes = bare.split(",")
        # The user name (n=) is ignored, as PostgreSQL does: the startup packet's user counts.
        if len(attributes) < 2 or not attributes[0].startswith("n=") or not attributes[1].startswith("r="):
            raise ProtocolViolation("malformed SCRAM message: expected n= and r= attributes")
        if any(a.startswith("m=") for a in attributes[2:]):
            raise NotSupported("SCRAM extensions (m=) are not supported")
        client_nonce = attributes[1][2:]
        if not _PRINTABLE_NONCE.fullmatch(client_nonce):
            raise ProtocolViolation("malformed SCRAM message: the client nonce is not printable")
        self._gs2_header = f"{flag},{authzid},"
        self._client_first_bare = bare
        self._nonce = client_nonce + _b64(os.urandom(_NONCE_BYTES))
        verifier = self._verifier
        self._server_first = f"r={self._nonce},s={_b64(verifier.salt)},i={verifier.iterations}"
        return self._server_first

    def _client_final(self, data: bytes) -> AuthStep:
        try:
            text = data.decode("ascii")
        except UnicodeDecodeError:
            raise ProtocolViolation("malformed SCRAM message: the final message is not ASCII") from None
        without_proof, separator, proof_text = text.rpartition(",p=")
        if not separator:
            raise ProtocolViolation("malformed SCRAM message: the proof is missing")
        attributes = without_proof.split(",")
        if len(attributes) < 2 or not attributes[0].startswith("c=") or not attributes[1].startswith("r="):
            raise ProtocolViolation("malformed SCRAM message: expected c= and r= attributes")
        try:
            binding = base64.b64decode(attributes[0][2:], validate=True)
            proof = base64.b64decode(proof_text, validate=True)
        except (binascii.Error, ValueError):
            raise ProtocolViolation("malformed SCRAM message: invalid base64") from None
        if binding != self._gs2_header.encode():
            raise ProtocolViolation("SCRAM channel binding check failed")
        if not hmac.compare_digest(attributes[1][2:].encode(), self._nonce.encode()):
            raise ProtocolViolation("malformed SCRAM message: the nonce does not match")
        if len(proof) != scram.KEY_LENGTH:
            raise ProtocolViolation("malformed SCRAM message: the proof has the wrong length")
        verifier = self._verifier
        auth_message = f"{self._client_first_bare},{self._server_first},{without_proof}".encode()
        client_signature = hmac.digest(verifier.stored_key, auth_message, "sha256")
        client_key = bytes(a ^ b for a, b in zip(proof, client_signature, strict=True))
        valid = hmac.compare_digest(hashlib.sha256(client_key).digest(), verifier.stored_key)
        if not valid or self._mock:
            return AuthStep(finished=True)
        self.authenticated = True
        server_signature = hmac.digest(verifier.server_key, auth_message, "sha256")
        return AuthStep(codec.AuthenticationSASLFinal(f"v={_b64(server_signature)}".encode()), finished=True)


class CleartextExchange(_VerifierExchange):
    """The `password` method: the password travels in clear (use TLS), checked against the verifier."""

    method = AuthMethod.PASSWORD

    def start(self) -> BackendMessage:
        return codec.AuthenticationCleartextPassword()

    async def respond(self, message: AuthenticationResponse, run_blocking: RunBlocking) -> AuthStep:
        password = message.password()
        if not password:
            return AuthStep(finished=True)
        # PBKDF2 over the verifier's iterations: off the event loop, and run for unknown users too.
        valid = await run_blocking(self._verifier.matches, password)
        self.authenticated = bool(valid) and not self._mock
        return AuthStep(finished=True)


class Md5Exchange(AuthExchange):
    """PostgreSQL's md5 challenge: md5(md5(password || user) || salt), against `md5_password`."""

    method = AuthMethod.MD5

    def __init__(self, user: str, md5_password: str, *, mock: bool) -> None:
        super().__init__(user, mock=mock)
        self._stored = md5_password.removeprefix("md5")
        self._salt = os.urandom(4)

    def start(self) -> BackendMessage:
        return codec.AuthenticationMD5Password(self._salt)

    async def respond(self, message: AuthenticationResponse, run_blocking: RunBlocking) -> AuthStep:
        answer = message.password()
        expected = "md5" + hashlib.md5(self._stored.encode() + self._salt).hexdigest()
        valid = hmac.compare_digest(answer.encode(), expected.encode())
        self.authenticated = valid and not self._mock
        return AuthStep(finished=True)


def md5_password(password: str, user: str) -> str:
    """PostgreSQL's stored md5 form of a password: "md5" + md5(password || user name) in hex."""
    return "md5" + hashlib.md5((password + user).encode()).hexdigest()


class Authenticator:
    """Starts the right exchange for a user, from the policy's credentials and enabled methods.

    Method choice: the first of `server.auth_methods` the analyst has a credential for (SCRAM and
    cleartext need `password`, md5 needs `md5_password`); an unknown analyst, or one with no usable
    credential, gets the first method listed, run against a mock credential. When the list holds
    several methods and analysts differ in their credentials, the method offered can tell a
    client which kind of credential a name has, as with PostgreSQL's own md5/SCRAM fallback.
    """

    def __init__(self, policy: Policy, secret: bytes | None = None) -> None:
        self._policy = policy
        self._methods = policy.server.auth_methods
        self._verifiers = {a.name: scram.parse_verifier(a.password) for a in policy.analysts if a.password}
        # The mock's iteration count is the default one, what `dpproxy policy passwd` writes (as
        # PostgreSQL's mock uses its scram_iterations): one that hung on the policy's credentials
        # would change with them. An analyst whose verifier has another count stands out by it.
        self._mock_iterations = scram.DEFAULT_ITERATIONS
        # Mock salts must be stable per user name (a salt that changed between attempts would give
        # away an unknown user) and unpredictable: derived from `secret`, kept in the ledger (as
        # PostgreSQL keeps its mock nonce), so the same across restarts and policy reloads, where
        # real salts stay too: a key drawn from the credentials changed every unknown name's salt
        # when an analyst was added, and the names whose salt did not were the real ones (an
        # adversarial review). Without a ledger (the Python API, tests), the policy's credentials.
        if secret is None:
            secret = hashlib.sha256(
                b"dpproxy mock credentials\x00"
                + b"\x00".join(
                    f"{a.name}:{a.password or ''}:{a.md5_password or ''}".encode() for a in policy.analysts
                )
            ).digest()
        self._mock_secret = hmac.digest(secret, b"dpproxy mock credentials", "sha256")

    def start(self, user: str, *, encrypted: bool = True) -> AuthExchange:
        """The exchange for `user`; `encrypted`: the connection went through TLS, without which a
        cleartext password is never asked for (28000 when no other method is listed)."""
        methods = [m for m in self._methods if encrypted or m is not AuthMethod.PASSWORD]
        if not methods:
            raise TLSRequired(
                "the server asks for passwords in cleartext (server.auth_methods: [password]), which "
                "it does only over TLS",
                hint="connect with TLS (sslmode=require), or ask the operator to list scram-sha-256",
            )
        analyst = self._policy.analyst(user)
        for method in methods:
            exchange = self._real(method, user, analyst)
            if exchange is not None:
                return exchange
        return self._mock(methods[0], user)

    def _real(self, method: AuthMethod, user: str, analyst: AnalystPolicy | None) -> AuthExchange | None:
        if analyst is None:
            return None
        if method is AuthMethod.MD5:
            return Md5Exchange(user, analyst.md5_password, mock=False) if analyst.md5_password else None
        verifier = self._verifiers.get(analyst.name)
        if verifier is None:
            return None
        if method is AuthMethod.SCRAM_SHA_256:
            return ScramExchange(user, verifier, mock=False)
        return CleartextExchange(user, verifier, mock=False)

    def _mock(self, method: AuthMethod, user: str) -> AuthExchange:
        def derive(label: bytes, size: int) -> bytes:
            return hmac.digest(self._mock_secret, label + user.encode(), "sha256")[:size]

        if method is AuthMethod.MD5:
            return Md5Exchange(user, "md5" + derive(b"md5:", 16).hex(), mock=True)
        verifier = ScramVerifier(
            self._mock_iterations,
            derive(b"salt:", scram.SALT_LENGTH),
            derive(b"stored:", scram.KEY_LENGTH),
            derive(b"server:", scram.KEY_LENGTH),
        )
        if method is AuthMethod.SCRAM_SHA_256:
            return ScramExchange(user, verifier, mock=True)
        return CleartextExchange(user, verifier, mock=True)


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")
