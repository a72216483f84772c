"""The errors of data files: what the commands report in one line.

A data module that cannot read its files raises :class:`DataFilesError` (or :class:`MissingDataFiles` when they
are not there), naming the file, what is wrong with it and how to get a good copy. ``train``, ``evaluate`` and
``diagnose`` print that message on one line and exit with status 2 (``train`` keeps the failure record of the run),
as for a bad config value, instead of a traceback.
"""

from __future__ import annotations


class DataFilesError(ValueError):
    """Data files that are unreadable, corrupt, or not what the data config asks for."""


class MissingDataFiles(DataFilesError, FileNotFoundError):
    """Data files that are not there (with where they were looked for and how to get them)."""
