"""``python -m residual_fairseq.benchmark``: the same as ``residual-fairseq-benchmark``."""
import sys

from . import main

sys.exit(main())
