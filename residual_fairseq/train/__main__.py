"""``python -m residual_fairseq.train``: the residual-fairseq-train command."""
from .cli import main

main()
