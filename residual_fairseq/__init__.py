"""residual-fairseq: the ResiDual transformer as a fairseq plugin.

Importing this package (directly, or via ``--user-dir``) registers the ``resi_dual``
model and its architectures, and allowlists the few globals that fairseq's
checkpoint files need under ``torch.load(weights_only=True)``.
"""
import logging
import os

_ROOT_LOG_LEVEL = logging.getLogger().level  # before fairseq's import sets it to DEBUG (see runtime)

from . import runtime, safe_checkpoints  # noqa: E402
from .models import ResiDualConfig, ResiDualModel  # noqa: E402,F401  (registers resi_dual)

__version__ = "0.1.0"

# What to pass to ``--user-dir`` / ``common.user_dir`` for an installed copy.
USER_DIR = os.path.dirname(os.path.abspath(__file__))

safe_checkpoints.allow_fairseq_checkpoint_globals()
runtime.undo_debug_logging_of_fairseq_import(_ROOT_LOG_LEVEL)
