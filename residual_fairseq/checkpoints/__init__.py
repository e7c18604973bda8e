"""Checkpoint files as untrusted input: every check before unpickling, and the hand-over to fairseq.

One path for every loader, :func:`read_checkpoint` (:mod:`.read`): the file is read
once, its zip layout checked (:mod:`.archive`), its pickle scanned without building
anything (:mod:`.scan`), loaded with ``torch.load(weights_only=True)``, and its
layout, config strings and architecture checked (:mod:`.layout`,
:mod:`.config_strings`). Where fairseq would build the model
(:func:`prepare_for_fairseq`, :mod:`.load`), the config must fit the weights
(:mod:`.sizes`). Anything wrong is a :class:`CheckpointError`: one line that names
the file. Options of a config in any of its forms: :mod:`.options`. Repair of a
``checkpoint_last.pt`` cut off by a crash: :mod:`.repair`.

Importing ``residual_fairseq`` makes fairseq itself open checkpoints through
:func:`load_checkpoint_to_cpu` (:mod:`residual_fairseq.fairseq_patches`).
"""
from .archive import is_intact
from .config_strings import EVALUATED_FIELDS, CodeInConfigError, literal_value
from .errors import CheckpointError, WeightsMismatchError
from .layout import checkpoint_architecture, checkpoint_task, checkpoint_task_option
from .load import WEIGHTS_FROM_CHECKPOINT, load_checkpoint_to_cpu, load_models, prepare_for_fairseq
from .options import config_option, drop_config_option, set_config_option
from .read import read_checkpoint, verify_checkpoint_file
from .repair import repair_last_checkpoint, run_checkpoints
from .scan import fairseq_checkpoint_globals
from .sizes import check_config_fits_weights, config_shapes

__all__ = [
    "EVALUATED_FIELDS", "WEIGHTS_FROM_CHECKPOINT", "CheckpointError", "CodeInConfigError", "WeightsMismatchError",
    "check_config_fits_weights", "checkpoint_architecture", "checkpoint_task", "checkpoint_task_option",
    "config_option", "config_shapes", "drop_config_option", "fairseq_checkpoint_globals", "is_intact",
    "literal_value", "load_checkpoint_to_cpu", "load_models", "prepare_for_fairseq", "read_checkpoint",
    "repair_last_checkpoint", "run_checkpoints", "set_config_option", "verify_checkpoint_file",
]
