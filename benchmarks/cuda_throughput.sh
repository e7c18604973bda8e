#!/bin/bash
# What ResiDual costs against Post-LN in training tokens/s at wmt_en_de size on one GPU
# (issue 37), timed by CUDA events, at batch sizes large enough that the device computes
# rather than waits for kernel launches -- and a check that it does. Results go to $OUT
# (default ./cuda-throughput-out): log.txt and results.tar.gz (speed-<tokens>.json/.md/.txt).
#
#   bash benchmarks/cuda_throughput.sh DATA_BIN     # DATA_BIN: residual-fairseq-prepare's bin/
#   QUICK=1 bash benchmarks/cuda_throughput.sh DATA_BIN   # a CPU smoke test of this script (seconds)
#
# `residual-fairseq-benchmark speed` in fp16 autocast, 6+6 layers of wmt_en_de's size (512
# wide, 2,048 FFN, 8 heads; the sample's ~8k vocabulary, not WMT's 32k, so the output layer
# is lighter than in the paper), Post-LN, Pre-LN and ResiDual, 3 repeats interleaved, at
# 8,192 and 32,768 tokens per batch. Each variant at each size is a fresh process; the timed
# updates are measured between two CUDA events (benchmark/speed.py: Stopwatch).
#
# Launch-bound or not: if the device waited for launches, an update would take about as long
# at 32k tokens as at 8k and tokens/s would grow ~4x; computing, tokens/s stays about the
# same. The last lines print that ratio per variant; read the ResiDual/Post-LN ratio at a
# size whose ratio is near 1. (The 2026-12-04 lease was launch-bound at 4,096 tokens: 0.35 s
# per update of a 45M-parameter model, docs/results/benchmarks.md.)
#
# Sized for one call of under 10 minutes: 18 measurements of ~15-25 s, each step cut at
# its time limit (a cut step keeps what it printed).
set -u
DATA=${1:?usage: cuda_throughput.sh DATA_BIN}
OUT=${OUT:-$PWD/cuda-throughput-out}
QUICK=${QUICK:-0}
RES=$(mktemp -d /tmp/cuda-throughput.XXXXXX)
source "$(dirname "$0")/device_env.sh"   # logging, pack, wheels, environment check

if [ "$QUICK" = 1 ]; then
    DEVICE=cpu; PREC=bf16; SIZES=tiny:2; TOKENS="256 512"; LIMIT=300
    ARGS="--repeats 1 --warmup 1 --updates 2 --decode-sentences 2 --decode-batch-size 2 --threads 1"
else
    DEVICE=cuda; PREC=fp16; SIZES=wmt_en_de:6; TOKENS="8192 32768"; LIMIT=270
    ARGS="--repeats 3 --warmup 5 --updates 20 --decode-sentences 64 --decode-batch-size 64"
fi

for tokens in $TOKENS; do
    say "speed at $tokens tokens per batch ($PREC autocast, $SIZES)"
    timeout $LIMIT python3 scripts/benchmark.py speed --data "$DATA" --device $DEVICE --precision $PREC \
        --sizes $SIZES --variants post_ln,pre_ln,resi_dual --max-tokens $tokens $ARGS \
        --json "$RES/speed-$tokens.json" --markdown "$RES/speed-$tokens.md" > "$RES/speed-$tokens.txt" 2> "$RES/speed-$tokens.err"
    say "exit $?"; cat "$RES/speed-$tokens.txt"; pack
done

say "launch-bound check and ResiDual's cost"
python3 - "$RES" $TOKENS <<'PY'
import json, statistics, sys
from pathlib import Path
res, sizes = Path(sys.argv[1]), sys.argv[2:]
rates = {}  # (tokens, variant) -> median train tokens/s over repeats
for tokens in sizes:
    path = res / f"speed-{tokens}.json"
    if not path.is_file():
        print(f"{tokens} tokens: no result"); continue
    by_variant = {}
    for run in json.loads(path.read_text())["runs"]:
        by_variant.setdefault(run["variant"], []).append(run["train_tokens_per_s"])
        timer = run.get("timer")
    for variant, values in by_variant.items():
        rates[tokens, variant] = statistics.median(values)
    print(f"{tokens} tokens ({timer}): " + ", ".join(
        f"{v} {rates[tokens, v]:,.0f} tok/s" + (f" ({rates[tokens, v] / rates[tokens, 'post_ln']:.3f}x post_ln)"
                                                  if (tokens, "post_ln") in rates else "")
        for v in by_variant))
small, large = sizes[0], sizes[-1]
for variant in ("post_ln", "pre_ln", "resi_dual"):
    if (small, variant) in rates and (large, variant) in rates:
        growth = rates[large, variant] / rates[small, variant]
        print(f"{variant}: tokens/s at {large} / at {small} tokens = {growth:.2f} "
              f"(~1: computing; ~{int(large) // int(small)}: launch-bound)")
PY
pack
say "done"
