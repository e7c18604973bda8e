#!/usr/bin/env bash
# Install residual-fairseq (editable) into the current Python environment.
#
# torch is installed first, and only if missing: an unpinned torch pulled in by
# fairseq would be a multi-GB CUDA build, and a torch you already have is kept.
# Override the one installed here with TORCH_SPEC (default torch==2.13.0, which on
# the project's CPU machines is a local CPU build). Set PYTHON to pick the interpreter.
set -euo pipefail
PYTHON=${PYTHON:-python3}
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if ! "$PYTHON" -c "import torch" 2>/dev/null; then
  echo "[install] no torch found: installing ${TORCH_SPEC:-torch==2.13.0}"
  "$PYTHON" -m pip install --quiet "${TORCH_SPEC:-torch==2.13.0}"
fi
"$PYTHON" -m pip install --quiet -e ".[test]"
"$PYTHON" -c "import torch, fairseq; print(f'[install] torch {torch.__version__}, fairseq {fairseq.__version__}')" 2>/dev/null
