#!/bin/bash
# The GPU checks, as one bounded script: what a CUDA machine can tell that the
# 2-core CPU machine cannot. Results go to $OUT (default ./cuda-checks-out):
# log.txt (everything, as it happens) and results.tar.gz (one file per check).
#
#   1. speed: `residual-fairseq-benchmark speed` in fp16 autocast, all six variants
#      at the iwslt_de_en and wmt_en_de presets (6+6 layers): the throughput, memory
#      and decoding ratios against Post-LN, alone on the GPU;
#   2. depth: `residual-fairseq-benchmark depth` at the published CPU setting
#      (width 64, 300 updates of 1,024 tokens, lr 1e-3, 100 warm-up updates) in
#      fp32, bf16 and fp16 autocast at 6, 18 and 48 layers;
#   3. fairseq --fp16: the paper's OPUS-100 setting (configs/opus100: 18+18 layers
#      of 512, memory-efficient fp16, initial loss scale 8) trained briefly with
#      fairseq-train for every variant, ResiDual with dual scale 0.05 and 1.0;
#   4. decoding on CUDA: residual-fairseq-evaluate on the ResiDual checkpoint of 3.
#
# Every step has its own time limit, so the script ends in about 9 minutes whatever
# happens; a step cut short keeps the lines it printed. Checks 2 and 3 run side by
# side (they measure losses, not time); check 1 runs alone.
#
#   bash benchmarks/cuda_checks.sh DATA_BIN      # DATA_BIN: residual-fairseq-prepare's bin/
#
# Sized for a 10-minute call. On the 2026-12-04 lease (a sandboxed H200 where every kernel
# launch was expensive) each step hit its limit: the speed step finished 5 of 24
# measurements (~30 s each), no 18- or 48-layer depth run finished, and the fp16 runs
# reached 200 of 300 updates (docs/benchmarks.md, "Results on an H200"). On a similar
# lease, cut the plan (one size, fewer variants, 6 and 18 layers) rather than the limits.
#
# Set-up shared with cuda_depth_decode.sh (logging, wheels from .whl/ for a device that
# has torch but not fairseq, the environment check) is in device_env.sh.
set -u
DATA=${1:?usage: cuda_checks.sh DATA_BIN}
OUT=${OUT:-$PWD/cuda-checks-out}
QUICK=${QUICK:-0}             # 1: a seconds-long smoke test of this script (CPU, bf16)
RES=$(mktemp -d /tmp/cuda-checks.XXXXXX)
source "$(dirname "$0")/device_env.sh"   # logging, pack, wheels, environment check

BENCH="python3 scripts/benchmark.py"
TRAIN="python3 scripts/train.py"
if [ "$QUICK" = 1 ]; then
    DEVICE=cpu; SPEED_PREC=bf16; DEPTH_PRECS="fp32 bf16"; DEPTHS_SHALLOW=2; DEPTH_DEEP=3
    SPEED_ARGS="--sizes tiny:2 --repeats 1 --warmup 1 --updates 1 --max-tokens 256 --decode-sentences 4 --decode-batch-size 4"
    DEPTH_ARGS="--updates 3 --warmup-updates 1 --max-tokens 256 --valid-batches 2"
    FP16_ARGS="--layers 2 --cpu -- --max-update 2 --update-freq 1 --warmup-updates 1 --max-tokens 256"
    T_SPEED=300; T_CHECKS=300; T_EVAL=300; EVAL_ARGS="--subset valid --batch-size 8"
else
    DEVICE=cuda; SPEED_PREC=fp16; DEPTH_PRECS="fp32 bf16 fp16"; DEPTHS_SHALLOW=6,18; DEPTH_DEEP=48
    SPEED_ARGS="--sizes iwslt_de_en:6,wmt_en_de:6 --repeats 2 --warmup 5 --updates 20 --max-tokens 4096 --decode-sentences 128 --decode-batch-size 64"
    DEPTH_ARGS="--width 64 --updates 300 --lr 1e-3 --warmup-updates 100 --max-tokens 1024"
    FP16_ARGS="--layers 18 -- --max-update 300 --update-freq 1 --warmup-updates 150"
    T_SPEED=170; T_CHECKS=250; T_EVAL=50; EVAL_ARGS=""
fi
[ -n "${SKIP_DEPTH:-}" ] && DEPTH_PRECS=""   # smoke tests of one step at a time

if [ -z "${SKIP_SPEED:-}" ]; then
say "1/4 speed ($SPEED_PREC autocast, alone on the device)"
timeout $T_SPEED $BENCH speed --data "$DATA" --device $DEVICE --precision $SPEED_PREC $SPEED_ARGS \
    --json "$RES/speed.json" --markdown "$RES/speed.md" > "$RES/speed.txt" 2> "$RES/speed.err"
say "speed exit $?"; cat "$RES/speed.txt"; pack
fi

say "2/4 depth and 3/4 fairseq fp16, side by side"
pids=()
for prec in $DEPTH_PRECS; do
    # the deep stack is split by variant so that no single process holds the others up
    for part in "shallow:$DEPTHS_SHALLOW:post_ln,pre_ln,resi_dual,deepnet,admin,b2t" \
                "deepA:$DEPTH_DEEP:post_ln,pre_ln,resi_dual" "deepB:$DEPTH_DEEP:deepnet,admin,b2t"; do
        IFS=: read -r name depths variants <<< "$part"
        timeout $T_CHECKS $BENCH depth --data "$DATA" --device $DEVICE --precision $prec --threads 1 \
            --depths $depths --variants $variants $DEPTH_ARGS --json "$RES/depth-$prec-$name.json" \
            > "$RES/depth-$prec-$name.txt" 2> "$RES/depth-$prec-$name.err" &
        pids+=($!)
    done
done
for run in post_ln pre_ln resi_dual deepnet admin b2t resi_dual_scale1; do
    variant=${run%_scale1}; extra=(); save=(--no-save)
    [ "$run" = resi_dual_scale1 ] && extra=(--dual-scale-encoder 1.0 --dual-scale-decoder 1.0)
    [ "$run" = resi_dual ] && save=()
    OMP_NUM_THREADS=1 timeout $T_CHECKS $TRAIN --dataset opus100 --variant $variant --data "$DATA" \
        -s es -t en --save-dir "$RES/fp16-$run" --no-progress --threads 1 $FP16_ARGS "${save[@]}" "${extra[@]}" \
        > "$RES/fp16-$run.log" 2>&1 &
    pids+=($!)
done
for pid in "${pids[@]}"; do wait $pid; done
for f in "$RES"/depth-*.err; do say "$(basename $f)"; grep -E "loss .* ->" "$f"; done
for f in "$RES"/fp16-*.log; do
    say "$(basename $f): $(grep -c 'gradient overflow' $f) overflow notes; last:"
    grep -E '\| (train|valid) \||Traceback|[A-Za-z]+Error|Minimum loss scale' "$f" | tail -3
done
pack

say "4/4 decoding on $DEVICE"
ckpt="$RES/fp16-resi_dual/checkpoint_last.pt"
if [ -f "$ckpt" ]; then
    timeout $T_EVAL python3 scripts/evaluate.py "$ckpt" "$DATA" --threads 1 $EVAL_ARGS \
        --out-json "$RES/eval-resi_dual.json" > "$RES/eval.txt" 2>&1
    say "evaluate exit $?"; tail -5 "$RES/eval.txt"
    rm -f "$RES"/fp16-*/*.pt      # checkpoints do not travel back
fi
pack
say "done"
