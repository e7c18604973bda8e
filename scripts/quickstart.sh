#!/usr/bin/env bash
# The main job on the bundled Spanish-English sample corpus, on CPU:
# install, prepare, train a small 3+3-layer ResiDual, evaluate (sacreBLEU, chrF), translate.
#
#   bash scripts/quickstart.sh                       # outputs under runs/quickstart/
#   QUICKSTART_EPOCHS=6 bash scripts/quickstart.sh   # train longer than the config's epochs
#   RESIDUAL_FAIRSEQ_THREADS=2 bash scripts/quickstart.sh   # CPU threads (default: half the cores)
#   QUICKSTART_SKIP_INSTALL=1 bash scripts/quickstart.sh    # already installed: skip scripts/install.sh
#
# Re-running skips what is done: preparation is a no-op, training resumes/finishes.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PYTHON:-python3}
OUT=${QUICKSTART_DIR:-runs/quickstart}
DATA="$OUT/sample-es-en"
RUN="$OUT/resi_dual-3l"
EPOCHS=()
if [[ -n "${QUICKSTART_EPOCHS:-}" ]]; then EPOCHS=(-- --max-epoch "$QUICKSTART_EPOCHS"); fi
START=$SECONDS

step() { printf '\n+ %s\n' "$*"; "$@"; }

if [[ -z "${QUICKSTART_SKIP_INSTALL:-}" ]]; then bash scripts/install.sh; fi
step "$PY" scripts/prepare.py --dataset sample-es-en --out "$DATA"
step "$PY" scripts/train.py --dataset sample-es-en --variant resi_dual --layers 3 \
    --data "$DATA/bin" --save-dir "$RUN" "${EPOCHS[@]}"
step "$PY" scripts/evaluate.py "$RUN/checkpoint_last.pt" "$DATA/bin" --subword sentencepiece \
    --generate-args "--max-len-a 1.2 --max-len-b 10" --out-json "$RUN/eval-test.json"
printf '\n+ echo "..." | %s scripts/translate.py %s --data %s\n' "$PY" "$RUN/checkpoint_last.pt" "$DATA/bin"
printf 'En el principio creó Dios los cielos y la tierra.\nY dijo Dios: Sea la luz; y fue la luz.\n' |
    "$PY" scripts/translate.py "$RUN/checkpoint_last.pt" --data "$DATA/bin"
ELAPSED=$((SECONDS - START))
printf '\nDone in %dm%02ds. Results: %s/eval-test.json; training log: %s/train.log\n' \
    $((ELAPSED / 60)) $((ELAPSED % 60)) "$RUN" "$RUN"
times
