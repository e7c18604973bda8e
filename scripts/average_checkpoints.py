#!/usr/bin/env python3
"""Average the parameters of fairseq checkpoints; see docs/evaluation.md or --help.

Example: python scripts/average_checkpoints.py --inputs checkpoints/ --num-epoch-checkpoints 5 --output avg.pt
"""
import sys
from pathlib import Path

# Run from a source checkout without installing.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from residual_fairseq.average_checkpoints import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
