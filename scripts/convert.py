#!/usr/bin/env python3
"""Convert a checkpoint of the ResiDual authors' implementation; see README or --help.

Example: python scripts/convert.py authors.pt resi_dual.pt
"""
import sys
from pathlib import Path

# Run from a source checkout without installing.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from residual_fairseq.convert import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
