"""What a part of the statement classifier (prepared.py, copy_to.py) needs of the whole: the
helpers classify.py's Classifier provides when it mixes the parts in."""

from __future__ import annotations

from dpproxy.wire.router.lexer import TokenReader
from dpproxy.wire.router.statement import Kind, Statement


class ClassifierPart(TokenReader):
    """A part of the classifier, mixed into it (classify.py), which provides the helpers below."""

    def holder(self, kind: Kind, tag: str) -> Statement | None:
        raise NotImplementedError

    def inner(self, sql: str) -> Statement:
        raise NotImplementedError

    def _parenthesized_text(self) -> str:
        raise NotImplementedError
