#!/usr/bin/env python3
"""Choose each variant's learning rate over reproduce matrices run one per rate; see docs/training.md or --help."""
import sys
from pathlib import Path

# Run from a source checkout without installing.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from residual_fairseq.reproduce.best_lr import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
