"""The plugin's fairseq models, one module per residual scheme.

Importing this package registers them with fairseq.
"""
from .resi_dual import ResiDualConfig, ResiDualModel  # noqa: F401  (registers resi_dual)
from .lm import ResiDualLanguageModel  # noqa: F401,E402  (registers resi_dual_lm)
