"""Run once (2026-12-06): the language-model records committed per run until then
(<variant>-6l/seed<N>/{run,result,valid-curve}.json) as the records residual-fairseq-reproduce
writes in runs.json (records.run_record's shape), so that `residual-fairseq-reproduce
--report-only --finished-runs` tabulates them with the runs of later sessions:

    python3 records_to_runs_json.py LM_RECORDS_DIR converted.json
    residual-fairseq-reproduce --dataset sample-lm --data DATA-LM/bin --layers 6 --seeds 1 2 3 \
        --finished-runs converted.json --out OUT --report-only      # OUT/runs.json: this folder's runs.json

Every one of these runs ended by the 60-epoch budget (their train.log said so; the records
predate runs.json, so ended_by is written here)."""
import json
import sys
from pathlib import Path

from residual_fairseq.reproduce.records import best_validation

root, out = Path(sys.argv[1]), Path(sys.argv[2])
records = []
for seed_dir in sorted(root.glob("*-*l/seed*")):
    run = json.loads((seed_dir / "run.json").read_text())
    result = json.loads((seed_dir / "result.json").read_text())
    curve = json.loads((seed_dir / "valid-curve.json").read_text())["valid_loss_bits_by_epoch"]
    validations = [{"epoch": int(e), "updates": p["num_updates"], "loss": p["valid_loss"], "bleu": None}
                   for e, p in sorted(curve.items(), key=lambda kv: int(kv[0]))]
    best = best_validation(validations)
    layers = run["decoder_layers"]
    records.append({"dataset": run["dataset"], "variant": run["variant"], "layers": layers, "seed": run["seed"],
                    "status": "finished", "epochs": validations[-1]["epoch"], "ended_by": "budget",
                    "best_valid_loss": best["loss"], "best_epoch": best["epoch"],
                    "test_ppl": result["perplexity"], "test_loss": result["loss_base2"],
                    "checkpoint": Path(result["checkpoint"]).name, "validations": validations})
out.write_text(json.dumps(records, indent=1) + "\n")
print(len(records), "records")
