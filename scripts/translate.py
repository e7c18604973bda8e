#!/usr/bin/env python3
"""Translate lines of text with a ResiDual checkpoint; see docs/evaluation.md or --help.

Example: echo "Hola." | python scripts/translate.py checkpoints/ --data data/sample.prepared/bin
"""
import sys
from pathlib import Path

# Run from a source checkout without installing.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from residual_fairseq.translate import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
