#!/bin/bash
# Issue 37's fair comparison on the bundled sample, step by step: the commands of
# docs/results/fair-comparison.md in one place. Every step is resumable: reproduce skips finished
# runs and resumes unfinished ones from checkpoint_last.pt, so rerun the same line after an
# interruption.
#
#   bash benchmarks/fair_comparison.sh OUT STEP...        # e.g. OUT=results/fair, STEP=lr6
#
# Steps (in the protocol's order):
#   dropout  Pre-LN 6 layers seed 1 at dropout 0.1 and 0.3 (dropout 0 is the lr-5e-3 matrix's run)
#   lr6      every variant at 6 layers, seed 1, at lr 5e-3, 2e-3 and 1e-3 (OUT/lr-RATE), to the full
#            budget (a run short6 left at SHORT epochs is trained on from its checkpoint: --extend)
#   lr18     the same at 18 layers
#   short6   the shortened selection at 6 layers: Pre-LN (the check row) at each rate to the full
#            budget, the other five variants for SHORT epochs (default 8); short18: at 18 layers
#   select   residual-fairseq-best-lr over OUT/lr-* (each rate's runs.json first rewritten with every
#            finished run of its --out): each row's rate, and whether the first SHORT epochs rank the
#            rates as the full runs do (--check-epochs)
#   extend   after short6/short18 and select, the rule fixed before any shortened run: at a depth
#            whose check row (Pre-LN) agrees, each row's chosen run is trained on to the full budget;
#            where it does not, every run of that depth is (the full selection); then select again
#   seeds    seeds 2 and 3 of each chosen row at its rate, then select again (the final table:
#            OUT/best-lr/results.md)
#   warmup   Post-LN, Pre-LN, ResiDual at 6 and 12 layers, seeds 1-3, lr 1e-3, with (OUT/warmup)
#            and without (OUT/no-warmup) warm-up; the with-warm-up 6-layer seed-1 runs are lr 1e-3's
#            (trained on to the full budget first where shortened)
#   lm6      the language models at 6 layers, seeds 1-3, until flat (patience 5, at most 60 epochs;
#            OUT/lm); lm24: at 24 layers
#
# Environment: DATA (sample-es-en's prepared bin/, default OUT/data/sample-es-en/bin), LM_DATA
# (sample-lm's, default OUT/data/sample-lm/bin), DROPOUT (step 1's choice, default 0.1), JOBS
# (runs at a time, default 1), THREADS (per run, default 1), FULL (the epoch budget, default 40:
# the protocol's), SHORT (epochs of a shortened selection run, default 8), DRY=1 (print, train nothing),
# CODE (the checkout whose package trains, default this one: a fixed commit's git worktree
# keeps code changed meanwhile out of a matrix; the selection always uses this checkout's).
# Two lanes on a 2-core machine:  fair_comparison.sh OUT short6 select extend seeds &
#                                 fair_comparison.sh OUT lm6 lm24 &
# (lr6, lr18, extend and warmup pass --extend: CODE must be a checkout that has it.)
set -euo pipefail
[ $# -gt 0 ] || { echo "error: usage: fair_comparison.sh OUT STEP... (steps: dropout lr6 lr18 short6 short18 select extend seeds warmup lm6 lm24)" >&2; exit 2; }
OUT=$1
shift
[ $# -gt 0 ] || { echo "error: give at least one step: dropout lr6 lr18 short6 short18 select extend seeds warmup lm6 lm24" >&2; exit 2; }
for step in "$@"; do
    case $step in dropout|lr6|lr18|short6|short18|select|extend|seeds|warmup|lm6|lm24) ;;
        *) echo "error: unknown step $step (steps: dropout lr6 lr18 short6 short18 select extend seeds warmup lm6 lm24)" >&2; exit 2 ;;
    esac
done
HERE=$(cd "$(dirname "$0")/.." && pwd)
CODE=${CODE:-$HERE}
DATA=${DATA:-$OUT/data/sample-es-en/bin}
LM_DATA=${LM_DATA:-$OUT/data/sample-lm/bin}
DROPOUT=${DROPOUT:-0.1}
RATES="5e-3 2e-3 1e-3"
FULL=${FULL:-40}
SHORT=${SHORT:-8}
for name in FULL SHORT; do
    case ${!name} in ''|*[!0-9]*|0*) echo "error: $name=${!name} is not a whole number of epochs above 0 (digits, no leading 0)" >&2; exit 2 ;; esac
done
[ "$SHORT" -lt "$FULL" ] || { echo "error: SHORT=$SHORT is not shorter than the $FULL-epoch budget (FULL)" >&2; exit 2; }
BUDGET="--max-epoch $FULL --patience 5"
CHECK_VARIANT=pre_ln  # the row run in full at every rate, whose check decides the extend step
SHORTENED="post_ln deepnet admin b2t resi_dual"
if [ "$DROPOUT" = 0 ]; then D="--dropout 0"; else D="--dropout $DROPOUT --attention-dropout 0.1 --activation-dropout 0.1"; fi
DRY_FLAG=; [ "${DRY:-0}" = 1 ] && DRY_FLAG=--dry-run
for step in "$@"; do  # before anything runs: the data each step trains on
    case $step in
        dropout|lr6|lr18|short6|short18|seeds|warmup) [ -d "$DATA" ] || { echo "error: DATA=$DATA is not a directory (sample-es-en's prepared bin/)" >&2; exit 2; } ;;
        lm6|lm24) [ -d "$LM_DATA" ] || { echo "error: LM_DATA=$LM_DATA is not a directory (sample-lm's prepared bin/)" >&2; exit 2; } ;;
    esac
done

reproduce() {  # reproduce FLAGS... -- FAIRSEQ_FLAGS...
    echo "+ reproduce $*"
    # A matrix with a failed run exits 2 after the others; the next matrix still runs.
    python3 "$CODE/scripts/reproduce.py" --jobs "${JOBS:-1}" --threads "${THREADS:-1}" $DRY_FLAG "$@" ||
        echo "note: that reproduce exited $? (a failed run is named in its tables); going on"
}
translation() { reproduce --dataset sample-es-en --data "$DATA" "$@"; }
reuse_for() {  # REUSE: rate $1's --finished-runs flags (lr 5e-3's Pre-LN 6-layer seed-1 run is step 1's
    REUSE=()     # selection run at the chosen dropout); an array, so that a path with spaces stays one word
    if [ "$1" = 5e-3 ] && [ -f "$OUT/dropout-$DROPOUT/runs.json" ]; then
        REUSE=(--finished-runs "$OUT/dropout-$DROPOUT/runs.json")
    fi
}
select_rates() {
    local matrices=()
    for lr in $RATES; do
        # A step's reproduce writes runs.json with its own part of the matrix only: tabulate the whole.
        echo "+ reproduce --report-only --out $OUT/lr-$lr"
        reuse_for $lr
        [ -n "$DRY_FLAG" ] || python3 "$HERE/scripts/reproduce.py" --dataset sample-es-en --data "$DATA" --layers 6 18 \
            --seeds 1 2 3 "${REUSE[@]}" --out "$OUT/lr-$lr" --report-only >/dev/null
        matrices+=(--matrix "$lr=$OUT/lr-$lr")
    done
    echo "+ best-lr ${matrices[*]} --out $OUT/best-lr --check-epochs $SHORT"
    [ -n "$DRY_FLAG" ] && return 0
    python3 "$HERE/scripts/best_lr.py" "${matrices[@]}" --out "$OUT/best-lr" --check-epochs "$SHORT"
}
selection() {  # selection chosen|extend: "variant layers rate" per run to train, from best-lr's selection.json
    # (read as hostile): chosen: each row's chosen rate; extend: the rule of the extend step above
    local file=$OUT/best-lr/selection.json
    [ -f "$file" ] || { echo "error: no $file: run the select step first" >&2; return 2; }
    python3 - "$file" "$RATES" "$CHECK_VARIANT" "$1" <<'PY'
import json, re, sys
path, rates, check_variant, mode = sys.argv[1], sys.argv[2].split(), sys.argv[3], sys.argv[4]
try:
    rows = [(row["variant"], row["layers"], row["chosen"], (row.get("check") or {}).get("verdict"))
            for row in json.load(open(path, encoding="utf-8"))["rows"]]
    assert all(re.fullmatch(r"[a-z0-9_]+", variant) and type(layers) is int and layers > 0
               and (chosen is None or chosen in rates) for variant, layers, chosen, _ in rows)
except Exception:
    print(f"error: {path} is not what residual-fairseq-best-lr writes: run the select step again", file=sys.stderr)
    sys.exit(2)
for depth in sorted({layers for _, layers, _, _ in rows}):
    verdict = next((v for variant, layers, _, v in rows if (variant, layers) == (check_variant, depth)), None)
    each_chosen = mode == "chosen" or verdict == "agrees"
    if mode == "extend":
        print(f"{depth} layers: the check row {check_variant}: {verdict or '-'}, so "
              + ("each chosen rate is trained on" if each_chosen else "every rate is trained on"), file=sys.stderr)
    for variant, layers, chosen, _ in rows:
        if layers == depth and chosen:
            for rate in ([chosen] if each_chosen else rates):
                print(variant, layers, rate)
PY
}
train_each() {  # train_each RUNS FLAGS...: per "variant layers rate" line of RUNS (selection's), that row at
    local variant layers lr  # that rate into the rate's --out, with FLAGS (the seeds, --extend)
    while read -r variant layers lr; do
        [ -n "$variant" ] || continue
        reuse_for $lr
        translation --variants "$variant" --layers "$layers" "${@:2}" "${REUSE[@]}" --out "$OUT/lr-$lr" -- \
            $BUDGET --lr $lr $D </dev/null
    done <<< "$1"
}

for step in "$@"; do
    echo "=== $step ($(date -u '+%F %T') UTC)"
    case $step in
    dropout)
        for d in 0.1 0.3; do
            translation --variants pre_ln --layers 6 --seeds 1 --out "$OUT/dropout-$d" -- $BUDGET \
                --dropout $d --attention-dropout 0.1 --activation-dropout 0.1
        done ;;
    lr6|lr18)
        for lr in $RATES; do
            reuse_for $lr
            translation --layers "${step#lr}" --seeds 1 "${REUSE[@]}" --extend --out "$OUT/lr-$lr" -- \
                $BUDGET --lr $lr $D
        done ;;
    short6|short18)
        for lr in $RATES; do
            reuse_for $lr
            translation --variants $CHECK_VARIANT --layers "${step#short}" --seeds 1 "${REUSE[@]}" \
                --out "$OUT/lr-$lr" -- $BUDGET --lr $lr $D
            translation --variants $SHORTENED --layers "${step#short}" --seeds 1 --out "$OUT/lr-$lr" -- \
                --max-epoch $SHORT --patience 5 --lr $lr $D
        done ;;
    select) select_rates ;;
    extend)
        runs=$(selection extend) || exit 2
        train_each "$runs" --seeds 1 --extend
        select_rates ;;
    seeds)
        runs=$(selection chosen) || exit 2
        train_each "$runs" --seeds 2 3
        select_rates ;;
    warmup)
        # lr 1e-3: the 300-update ablation's rate, where Post-LN learns with warm-up (at 5e-3 it fails with it).
        # The with-warm-up 6-layer seed-1 runs are lr 1e-3's: trained (on) there to the full budget, that
        # call's runs.json holds exactly them (reproduce checks their flags), and the warmup matrix takes it.
        translation --variants post_ln pre_ln resi_dual --layers 6 --seeds 1 --extend --out "$OUT/lr-1e-3" -- \
            $BUDGET --lr 1e-3 $D
        for kind in warmup no-warmup; do
            flag=; [ $kind = no-warmup ] && flag=--no-warmup
            REUSE=(); [ $kind = warmup ] && { [ -z "$DRY_FLAG" ] || [ -f "$OUT/lr-1e-3/runs.json" ]; } &&
                REUSE=(--finished-runs "$OUT/lr-1e-3/runs.json")
            translation --variants post_ln pre_ln resi_dual --layers 6 12 --seeds 1 2 3 $flag "${REUSE[@]}" \
                --out "$OUT/$kind" -- $BUDGET --lr 1e-3 $D
        done ;;
    lm6|lm24)
        for seeds in 1 "2 3"; do
            reproduce --dataset sample-lm --data "$LM_DATA" --layers "${step#lm}" --seeds $seeds --out "$OUT/lm" -- \
                --max-update 0 --max-epoch 60 --patience 5 --validate-interval-updates 0 --save-interval-updates 0
        done ;;
    esac
done
