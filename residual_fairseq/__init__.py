"""residual-fairseq: the ResiDual transformer as a fairseq plugin.

Importing this package (directly, or via ``--user-dir``) registers the ``resi_dual``
model and its architectures, and makes fairseq treat checkpoint files as untrusted
input (docs/reliability.md): it allowlists the few globals that fairseq's checkpoint
files need under ``torch.load(weights_only=True)``, opens every checkpoint through
:func:`residual_fairseq.safe_checkpoints.load_checkpoint_to_cpu` (checked before it
is unpickled), and gives fairseq a literal-only ``eval`` for config strings
(:mod:`residual_fairseq.config_strings`). In a fairseq-train that residual-fairseq-train
resumed, it also restores ``--patience``'s count (:mod:`residual_fairseq.early_stopping`),
and at exit it destroys a torch.distributed process group that fairseq left behind
(:func:`residual_fairseq.runtime.destroy_process_group_at_exit`).
"""
import logging
import os

_ROOT_LOG_LEVEL = logging.getLogger().level  # before fairseq's import sets it to DEBUG (see runtime)

from . import runtime  # noqa: E402  (stdlib only)

runtime.exit_quietly_on_interrupt_while_starting()  # before the seconds of importing fairseq
runtime.report_user_errors_in_fairseq_commands()  # a refused checkpoint in fairseq-generate: one line
runtime.destroy_process_group_at_exit()  # else a gloo rank may abort at exit after a finished run

from . import config_strings, early_stopping, safe_checkpoints  # noqa: E402
from .models import ResiDualConfig, ResiDualModel  # noqa: E402,F401  (registers resi_dual)

__version__ = "0.1.0"

# What to pass to ``--user-dir`` / ``common.user_dir`` for an installed copy.
USER_DIR = os.path.dirname(os.path.abspath(__file__))

safe_checkpoints.allow_fairseq_checkpoint_globals()
safe_checkpoints.install_loading_guard()
config_strings.close_fairseq_eval_calls()
early_stopping.restore_in_fairseq_train()  # only in a fairseq-train that residual-fairseq-train resumed
runtime.undo_debug_logging_of_fairseq_import(_ROOT_LOG_LEVEL)


def load_language_model(checkpoint, data=None, cpu=None):
    """A trained language model for sampling and beam search: ``.sample(prompt, ...)``.

    See :func:`residual_fairseq.language_models.load_language_model`.
    """
    from .language_models import load_language_model as load

    return load(checkpoint, data=data, cpu=cpu)
