"""residual-fairseq: the ResiDual transformer as a fairseq plugin.

Importing this package (directly, or via ``--user-dir``) changes fairseq globally in the
few ways that :func:`residual_fairseq.fairseq_patches.install` lists (checkpoint files
are checked as untrusted input before fairseq unpickles them, config strings are
evaluated as literals only, Ctrl-C and refused checkpoints are one line...), then
registers the ``resi_dual`` model, the other residual schemes and their architectures.
"""
import os

from . import fairseq_patches

fairseq_patches.install()  # first: its Ctrl-C handler covers the seconds of importing fairseq

from .models import ResiDualConfig, ResiDualModel  # noqa: E402,F401  (registers the models)

__version__ = "0.1.0"

# What to pass to ``--user-dir`` / ``common.user_dir`` for an installed copy.
USER_DIR = os.path.dirname(os.path.abspath(__file__))


def load_language_model(checkpoint, data=None, cpu=None):
    """A trained language model for sampling and beam search: ``.sample(prompt, ...)``.

    See :func:`residual_fairseq.language_models.load_language_model`.
    """
    from .language_models import load_language_model as load

    return load(checkpoint, data=data, cpu=cpu)
