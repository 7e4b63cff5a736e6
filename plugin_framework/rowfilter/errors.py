"""Errors raised while configuring row filters and column lists, and while evaluating them."""

from __future__ import annotations


class RowFilterError(ValueError):
    """A row filter or column list cannot be used: bad syntax, a construct PostgreSQL refuses
    in a publication WHERE clause, a column outside the replica identity, an unknown table...

    ``message`` is PostgreSQL's primary message where PostgreSQL has one (e.g. "invalid
    publication WHERE expression"), ``detail`` its detail (e.g. "User-defined types are not
    allowed."), ``context`` says which table and filter.
    """

    def __init__(self, message: str, *, detail: str | None = None,
                 context: str | None = None, hint: str | None = None) -> None:
        self.message = message
        self.detail = detail
        self.context = context
        self.hint = hint
        self.position: int | None = None  # 1-based offset in the filter's text, if known
        super().__init__(self._text())

    def _text(self) -> str:
        text = f"{self.context}: {self.message}" if self.context else self.message
        if self.detail:
            text += f"\nDETAIL:  {self.detail}"
        if self.hint:
            text += f"\nHINT:  {self.hint}"
        return text

    def with_context(self, context: str) -> RowFilterError:
        """The same error, said of a table's filter (the innermost context is kept)."""
        if self.context:
            return self
        err = type(self)(self.message, detail=self.detail, context=context, hint=self.hint)
        err.position = self.position
        err.__cause__ = self.__cause__
        return err


class NotSupportedError(RowFilterError):
    """PostgreSQL would accept the filter, but pgdecode cannot evaluate it faithfully."""


class EvaluationError(RowFilterError):
    """Evaluating a row filter failed the way it fails on the server (division by zero,
    integer out of range...). The server stops decoding with this error; so does pgdecode."""
