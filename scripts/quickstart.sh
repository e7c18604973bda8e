#!/usr/bin/env bash
# The main job on the bundled Spanish-English sample corpus, on CPU:
# install, prepare, train a small 3+3-layer ResiDual, evaluate (sacreBLEU, chrF), translate.
#
#   bash scripts/quickstart.sh                       # outputs under runs/quickstart/
#   QUICKSTART_EPOCHS=6 bash scripts/quickstart.sh   # train longer than the config's 2 epochs
#
# Re-running skips what is done: preparation is a no-op, training resumes/finishes.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PYTHON:-python3}
OUT=${QUICKSTART_DIR:-runs/quickstart}
EPOCHS=${QUICKSTART_EPOCHS:-2}
DATA="$OUT/sample-es-en"
RUN="$OUT/resi_dual-3l"

step() { printf '\n+ %s\n' "$*"; "$@"; }

bash scripts/install.sh
step "$PY" scripts/prepare.py --dataset sample-es-en --out "$DATA"
step "$PY" scripts/train.py --dataset sample-es-en --variant resi_dual --layers 3 \
    --data "$DATA/bin" --save-dir "$RUN" -- --max-epoch "$EPOCHS"
step "$PY" scripts/evaluate.py "$RUN/checkpoint_last.pt" "$DATA/bin" --subword sentencepiece \
    --out-json "$RUN/eval-test.json"
printf '\n+ echo "..." | %s scripts/translate.py %s --data %s\n' "$PY" "$RUN/checkpoint_last.pt" "$DATA/bin"
printf 'En el principio creó Dios los cielos y la tierra.\nY dijo Dios: Sea la luz; y fue la luz.\n' |
    "$PY" scripts/translate.py "$RUN/checkpoint_last.pt" --data "$DATA/bin"
printf '\nDone. Results: %s/eval-test.json; training log: %s/train.log\n' "$RUN" "$RUN"
