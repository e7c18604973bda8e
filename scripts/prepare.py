#!/usr/bin/env python3
"""Prepare a translation corpus for fairseq: see docs/data.md or --help.

Example: python scripts/prepare.py --dataset iwslt14-de-en --out data/iwslt14.de-en
"""
import sys
from pathlib import Path

# Run from a source checkout without installing.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from residual_fairseq.data.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
