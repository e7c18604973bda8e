"""The plugin's fairseq models, one module per residual scheme.

Importing this package registers them with fairseq: ``resi_dual`` (ResiDual) and
the deep Post-LN baselines ``deepnet`` (DeepNorm), ``admin`` and ``b2t``, and the
decoder-only ``resi_dual_lm`` for fairseq's language_modeling task.
"""
from .resi_dual import ResiDualConfig, ResiDualModel  # noqa: F401  (registers resi_dual)
from .deepnet import DeepNetModel  # noqa: F401  (registers deepnet)
from .admin import AdminConfig, AdminModel  # noqa: F401  (registers admin)
from .b2t import B2TModel  # noqa: F401  (registers b2t)
from .lm import ResiDualLanguageModel  # noqa: F401  (registers resi_dual_lm)
