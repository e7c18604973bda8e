"""The exception type of data preparation.

Everything a user can get wrong (a bad archive, a missing file, mismatched
sides, an unknown dataset, a clashing output directory, a failed download)
raises :class:`DataPreparationError` with a one-line message. It is a
:class:`residual_fairseq.errors.UserError`, so the project's CLI wrapper prints
it as ``error: <message>`` and exits with status 2, without a traceback.
"""
from ..errors import UserError


class DataPreparationError(UserError):
    """A preparation could not proceed; the message says why, in one line."""
