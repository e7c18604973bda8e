#!/bin/bash
# The second GPU lease's checks: what benchmarks/cuda_checks.sh could not finish on the
# first (a launch-bound sandboxed H200, 2026-12-04), sized for one 10-minute call.
# Results go to $OUT (default ./cuda-depth-decode-out): log.txt and results.tar.gz
# (re-packed every 30 s, so a call cut short still brings back what had finished).
#
#   1. decoding on CUDA: residual-fairseq-evaluate on converged 6-layer checkpoints from
#      the CPU machine, in fp32 and in fp16 (`fairseq-generate --fp16`). The CPU
#      translations travel beside each checkpoint as NAME.cpu.hyp.txt, and the step prints
#      how many CUDA translations are identical to them, and both BLEU scores;
#   2. depth in half precision: `residual-fairseq-benchmark depth` at the published
#      3-seed CPU setting (width 64, 300 updates of 1,024 tokens, lr 1e-3, 100 warm-up,
#      8 valid batches, seed 1) in bf16 and fp16 autocast, every variant at 18 layers,
#      and Post-LN, Pre-LN and ResiDual at 48; one process per run, each logging its loss
#      every 25 updates, so a run cut at the time limit shows how far it got.
#
#   bash benchmarks/cuda_depth_decode.sh DATA_BIN CKPT_DIR
#       DATA_BIN: residual-fairseq-prepare's bin/ (its manifest.json one folder up)
#       CKPT_DIR: NAME.pt checkpoints (optimizer state dropped to travel light), each
#                 with the CPU machine's NAME.cpu.hyp.txt of the same test set
#
# QUICK=1: a seconds-long smoke test of this script on a CPU (bf16, tiny plan).
# Set-up shared with cuda_checks.sh (logging, wheels, environment check): device_env.sh.
set -u
DATA=${1:?usage: cuda_depth_decode.sh DATA_BIN CKPT_DIR}
CKPTS=${2:?usage: cuda_depth_decode.sh DATA_BIN CKPT_DIR}
OUT=${OUT:-$PWD/cuda-depth-decode-out}
QUICK=${QUICK:-0}
RES=$(mktemp -d /tmp/cuda-depth-decode.XXXXXX)
source "$(dirname "$0")/device_env.sh"   # logging, pack, wheels, environment check

if [ "$QUICK" = 1 ]; then
    PRECS="bf16"; EVAL_PRECS="fp32"; DEVICE_FLAG="--cpu"; D18=1; D48=2; VARIANTS18="post_ln,resi_dual"
    DEPTH_ARGS="--width 16 --updates 4 --warmup-updates 1 --max-tokens 256 --valid-batches 1 --log-interval 2"
    EVAL_ARGS="--batch-size 64 --generate-args='--max-len-b 5'"; T_DEPTH=300; T_EVAL=300; DEVICE=cpu
else
    PRECS="bf16 fp16"; EVAL_PRECS=${EVAL_PRECS:-"fp32 fp16"}; DEVICE_FLAG=""; D18=18; D48=48
    VARIANTS18="post_ln,pre_ln,resi_dual,deepnet,admin,b2t"
    DEPTH_ARGS="--width 64 --updates 300 --lr 1e-3 --warmup-updates 100 --max-tokens 1024 --valid-batches 8 --log-interval 25"
    EVAL_ARGS=""; T_DEPTH=${T_DEPTH:-480}; T_EVAL=${T_EVAL:-240}; DEVICE=cuda
fi

( while sleep 30; do pack; done ) & packer=$!
pids=()
say "1/2 decoding on $DEVICE (${EVAL_PRECS}), 2/2 depth (${RUNS:-the default plan}), side by side"
for ckpt in "$CKPTS"/*.pt; do
    [ -e "$ckpt" ] || continue
    name=$(basename "$ckpt" .pt)
    for prec in $EVAL_PRECS; do
        gen=""; [ "$prec" = fp16 ] && gen="--generate-args=--fp16"
        eval timeout $T_EVAL python3 scripts/evaluate.py "$ckpt" "$DATA" --threads 1 $DEVICE_FLAG $EVAL_ARGS $gen \
            --out-json "$RES/eval-$name-$prec.json" > "$RES/eval-$name-$prec.log" 2>&1 &
        pids+=($!)
    done
done
# RUNS: the depth runs as PRECISION:LAYERS:VARIANT words (default: the plan above); EVAL_PRECS
# likewise overridable, so that a follow-up call can run just what is missing.
if [ -z "${RUNS:-}" ]; then
    RUNS=""
    for prec in $PRECS; do
        for run in $(echo $VARIANTS18 | tr , ' ' | sed "s/[^ ]*/$D18:&/g") "$D48:post_ln" "$D48:pre_ln" "$D48:resi_dual"; do
            RUNS="$RUNS $prec:$run"
        done
    done
fi
for run in $RUNS; do
    IFS=: read -r prec layers variant <<< "$run"
    timeout $T_DEPTH python3 scripts/benchmark.py depth --data "$DATA" --device $DEVICE --precision $prec \
        --threads 1 --depths $layers --variants $variant --seed 1 $DEPTH_ARGS \
        --json "$RES/depth-$prec-L$layers-$variant.json" \
        > "$RES/depth-$prec-L$layers-$variant.txt" 2> "$RES/depth-$prec-L$layers-$variant.err" &
    pids+=($!)
done
for pid in "${pids[@]}"; do wait $pid; done
kill $packer 2>/dev/null

say "decoding: BLEU / chrF on $DEVICE, and translations identical to the CPU machine's"
python3 - "$RES" "$CKPTS" <<'EOF'
import glob, json, os, sys
res, ckpts = sys.argv[1:]
for path in sorted(glob.glob(os.path.join(res, "eval-*.json"))):
    if path.endswith(".hyp.json"):
        continue
    run = os.path.basename(path)[len("eval-"):-len(".json")]
    name = run.rsplit("-", 1)[0]
    result = json.load(open(path))
    hyps = open(path[:-len(".json")] + ".hyp.txt").read().splitlines()
    cpu_path = os.path.join(ckpts, name + ".cpu.hyp.txt")
    same = "no CPU translations"
    if os.path.exists(cpu_path):
        cpu = open(cpu_path).read().splitlines()
        same = f"{sum(a == b for a, b in zip(hyps, cpu))} of {len(cpu)} identical to CPU" if len(cpu) == len(hyps) \
            else f"{len(hyps)} lines vs {len(cpu)} on CPU"
    print(f"{run}: BLEU {result['sacrebleu']['score']:.2f} chrF {result['chrf']['score']:.2f}; {same}")
EOF
for f in "$RES"/eval-*.log; do
    grep -qE "Traceback|error:" "$f" 2>/dev/null && { say "$(basename $f) failed:"; tail -3 "$f"; }
done
say "depth: each run's last progress line and its result"
for f in "$RES"/depth-*.err; do
    echo "$(basename $f .err): $(grep ': update ' $f | tail -1 | sed 's/.*: update/update/') | $(grep ' -> ' $f | sed 's/.*: loss/loss/')"
    grep -E "Traceback|Error" "$f" | tail -2
done
pack
say "done"
