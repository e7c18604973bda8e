# The set-up both device scripts share (cuda_checks.sh, cuda_depth_decode.sh), sourced
# once they have set OUT (where results go) and RES (a scratch folder): everything
# printed is logged to $OUT/log.txt, `pack` copies $RES into $OUT/results.tar.gz (whole
# or not at all), and the environment is checked before any step spends device time.
#
# Wheels in .whl/ (if present, and SKIP_WHEELS unset) are installed into /tmp/site first:
# the device machine has Python 3.12 and torch, not fairseq. QUICK=1 lets a CPU stand in.
mkdir -p "$OUT"
exec > >(tee -a "$OUT/log.txt") 2>&1
say() { echo "[$(date -u +%T)] $*"; }
pack() { tar czf "$OUT/results.tar.gz.part" -C "$RES" . && mv "$OUT/results.tar.gz.part" "$OUT/results.tar.gz"; }

if [ -d .whl ] && [ -z "${SKIP_WHEELS:-}" ]; then   # SKIP_WHEELS=1: use what is installed
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || { say "wheel install failed"; exit 1; }
    export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH} PATH=/tmp/site/bin:$PATH
fi
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
python3 - <<'PY' || { say "environment check failed"; exit 1; }
import os, torch, fairseq, sacrebleu, residual_fairseq
print("torch", torch.__version__, "cuda", torch.version.cuda, "fairseq", fairseq.__version__,
      "sacrebleu", sacrebleu.__version__, "plugin", os.path.dirname(residual_fairseq.__file__))
if torch.cuda.is_available():
    print("gpu", torch.cuda.get_device_name(0), "bf16", torch.cuda.is_bf16_supported())
elif os.environ.get("QUICK") != "1":
    raise SystemExit("no CUDA device visible")
PY
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
