#!/usr/bin/env python3
"""Thin wrapper: same as the ``residual-fairseq-analyze`` console script."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a source checkout

from residual_fairseq.analysis import main  # noqa: E402

if __name__ == "__main__":
    main()
