#!/usr/bin/env python3
"""Evaluate a checkpoint: average, fairseq-generate, sacreBLEU/chrF/tokenized BLEU; see docs/evaluation.md or --help.

Example: python scripts/evaluate.py checkpoints/ data-bin/ --last-n 5 --subword sentencepiece
"""
import sys
from pathlib import Path

# Run from a source checkout without installing.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from residual_fairseq.evaluate import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
