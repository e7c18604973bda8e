"""The errors of checkpoint loading: one line that names the file."""
from ..errors import UserError


class CheckpointError(UserError):
    """A checkpoint file is unreadable, malformed or unsafe; the message names the file."""


class WeightsMismatchError(CheckpointError):
    """The checkpoint's weights do not fit the model built for it (typically other dictionaries)."""

    def __init__(self, path, detail):
        self.detail = detail
        super().__init__(f"checkpoint {path} does not fit the dictionaries: {detail}")
