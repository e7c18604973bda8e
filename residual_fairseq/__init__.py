"""residual-fairseq: the ResiDual transformer as a fairseq plugin.

Importing this package (directly, or via ``--user-dir``) registers the ``resi_dual``
model and its architectures, and makes fairseq treat checkpoint files as untrusted
input (docs/reliability.md): it allowlists the few globals that fairseq's checkpoint
files need under ``torch.load(weights_only=True)``, opens every checkpoint through
:func:`residual_fairseq.safe_checkpoints.load_checkpoint_to_cpu` (checked before it
is unpickled), and gives fairseq a literal-only ``eval`` for config strings
(:mod:`residual_fairseq.config_strings`).
"""
import os

from . import config_strings, safe_checkpoints
from .models import ResiDualConfig, ResiDualModel  # noqa: F401  (registers resi_dual)

__version__ = "0.1.0"

# What to pass to ``--user-dir`` / ``common.user_dir`` for an installed copy.
USER_DIR = os.path.dirname(os.path.abspath(__file__))

safe_checkpoints.allow_fairseq_checkpoint_globals()
safe_checkpoints.install_loading_guard()
config_strings.close_fairseq_eval_calls()
