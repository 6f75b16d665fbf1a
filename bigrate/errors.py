"""Exceptions and warnings raised by bigrate.

Every error names what is at fault (a file and line, a parameter, a key path) and what
was expected, so that a user can fix the input without reading our code.
"""

from __future__ import annotations


class BigrateWarning(UserWarning):
    """Base class of bigrate's own warnings (soft failures that come with a fix)."""


class DataError(ValueError):
    """Bad input data: a malformed file, a bad label set, non-finite values, ...

    Parameters
    ----------
    message : str
        What is wrong and what was expected.
    path : str, optional
        The file at fault (its base name is enough for the user to find it).
    line : int, optional
        1-based line number in ``path``.
    column : str, optional
        The column at fault, for tabular inputs.
    """

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        line: int | None = None,
        column: str | None = None,
    ):
        self.path = path
        self.line = line
        self.column = column
        self.reason = message
        where = ""
        if path is not None:
            where = str(path)
            if line is not None:
                where += f":{line}"
            if column is not None:
                where += f" (column {column!r})"
            where += ": "
        super().__init__(where + message)


class DatasetExistsError(FileExistsError):
    """The output directory already holds a dataset and ``overwrite`` was not given."""


class ChecksumError(DataError):
    """A shard file's bytes do not match the sha256 recorded in the manifest."""
