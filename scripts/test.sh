#!/usr/bin/env bash
# Install what the tests need (idempotent), then run the whole test suite on CPU.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/install.sh
exec "${PYTHON:-python3}" -m pytest -q "$@"
