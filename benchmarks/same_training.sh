#!/bin/bash
# Do two checkouts train bit for bit alike? Each of the six variants is trained for 30 updates
# (2 layers, seed 1, dropout 0.1, one thread) by each checkout's residual-fairseq-train; the
# weights after the last update are compared exactly. Used before a matrix run from a fixed
# commit is continued or completed with newer code (docs/results/fair-comparison.md).
#
#   bash benchmarks/same_training.sh CHECKOUT_A CHECKOUT_B DATA_BIN   # DATA_BIN: sample-es-en's bin/
#
# Prints one line per variant (parameters compared, largest absolute difference) and exits 1
# when any differs.
set -eu
[ $# -eq 3 ] || { echo "error: usage: same_training.sh CHECKOUT_A CHECKOUT_B DATA_BIN" >&2; exit 2; }
A=$1 B=$2 DATA=$3
for code in "$A" "$B"; do
    [ -f "$code/scripts/train.py" ] || { echo "error: $code is not a residual-fairseq checkout (no scripts/train.py)" >&2; exit 2; }
done
[ -f "$DATA/dict.en.txt" ] || { echo "error: $DATA is not sample-es-en's prepared bin/ (no dict.en.txt)" >&2; exit 2; }
WORK=$(mktemp -d /tmp/same-training.XXXXXX)
VARIANTS="post_ln pre_ln resi_dual deepnet admin b2t"
for side in A B; do
    code=$A; [ $side = B ] && code=$B
    for variant in $VARIANTS; do
        python3 "$code/scripts/train.py" --dataset sample-es-en --variant $variant --layers 2 --data "$DATA" \
            --save-dir "$WORK/$side-$variant" --threads 1 -- --max-update 30 --no-epoch-checkpoints \
            --dropout 0.1 --attention-dropout 0.1 --activation-dropout 0.1 > "$WORK/$side-$variant.log" 2>&1 ||
            { echo "error: $code could not train $variant (log: $WORK/$side-$variant.log)" >&2; exit 2; }
    done
done
python3 - "$WORK" $VARIANTS <<'PY'
import sys
import torch
work, variants, differ = sys.argv[1], sys.argv[2:], False
for variant in variants:
    a, b = (torch.load(f"{work}/{side}-{variant}/checkpoint_last.pt", weights_only=False, map_location="cpu")
            for side in "AB")
    same_names = sorted(a["model"]) == sorted(b["model"])
    gap = max((a["model"][k].double() - b["model"][k].double()).abs().max().item() for k in a["model"]) \
        if same_names else float("inf")
    updates = [state["optimizer_history"][-1]["num_updates"] for state in (a, b)]
    differ |= gap != 0 or updates[0] != updates[1]
    print(f"{variant}: {len(a['model'])} tensors, updates {updates[0]}/{updates[1]}, largest difference {gap:g}")
print("identical" if not differ else "DIFFERENT")
sys.exit(1 if differ else 0)
PY
