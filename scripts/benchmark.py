#!/usr/bin/env python3
"""Thin wrapper: ``python3 scripts/benchmark.py speed|depth --data DIR ...``."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from residual_fairseq.benchmark import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
