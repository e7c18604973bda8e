"""A reproduce run's record: its numbers, how its training ended, and runs.json records read back as hostile.

Each run's ``result.json`` (test numbers) and ``train.log`` (fairseq's JSON log: every
validation), or for a run finished elsewhere its record in an earlier ``runs.json``
(:func:`read_finished_runs`), are read, never trusted blindly: a record this tool did not
write is a one-line error.

A run is a :class:`residual_fairseq.reproduce.runs.Run`, read here through its attributes
(dataset, variant, layers, seed, finished, failure, result(), curve(), ended_by()) only:
this module does not import the runs module, which imports it.
"""
import json
import re
from pathlib import Path
from typing import Optional

from .. import configs
from ..argtypes import is_finite_number, read_regular_file
from ..errors import UserError
from ..variants import VARIANTS

METRICS = (  # (column, label in the markdown table)
    ("test_bleu", "test sacreBLEU"),
    ("test_chrf", "test chrF"),
    ("test_tok_bleu", "test tok. BLEU"),
    ("best_valid_bleu", "best valid BLEU"),
    ("best_valid_loss", "best valid loss"),   # the checkpoint_best.pt that is scored
    ("last_valid_loss", "last valid loss"),
)
# Language models (configs whose DatasetSpec.task is language_modeling): perplexities.
LM_METRICS = (
    ("test_ppl", "test perplexity"),
    ("test_loss", "test loss (base 2)"),
    ("best_valid_ppl", "best valid perplexity"),
)
_EARLY_STOP = re.compile(r"early stop since valid performance hasn't improved for last (\d+) runs")


def is_language_model(dataset: str) -> bool:
    return configs.DATASETS[dataset].task == "language_modeling"


def metrics_for(dataset: str):
    return LM_METRICS if is_language_model(dataset) else METRICS


def dig(value, keys):
    """``value[k1][k2]...`` for ``keys``; None where a level is missing or is not a dict
    (reading JSON someone else may have written)."""
    for key in keys:
        value = value.get(key) if isinstance(value, dict) else None
    return value


def data_label(dataset: str, data_name=None) -> str:
    """How tables and plots name a run's data: the data's own name (its directory: ``YOUR_CORPUS``
    for ``YOUR_CORPUS/bin``), with the config it was trained with when that is another name
    (``YOUR_CORPUS (config sample-es-en)``); the config's name when the data's is not known."""
    if not data_name or data_name == dataset:
        return dataset
    return f"{data_name} (config {dataset})"


def run_label(run) -> str:
    """:func:`data_label` of a run."""
    return data_label(run.dataset, getattr(run, "data_name", None))


def run_metrics(run: "Run") -> dict:
    """The numbers one finished run contributes to the table."""
    result = run.result()
    curve = run.curve()
    if is_language_model(run.dataset):
        return {"test_ppl": result["perplexity"], "test_loss": result["loss_base2"],
                "best_valid_ppl": min((2 ** point["loss"] for point in curve), default=None)}
    bleus = [point["bleu"] for point in curve if point["bleu"] is not None]
    tokenized_bleu = dig(result, ("tokenized_bleu", "score"))  # optional: older results lack it
    return {
        "test_bleu": result["sacrebleu"]["score"],
        "test_chrf": result["chrf"]["score"],
        "test_tok_bleu": tokenized_bleu if is_finite_number(tokenized_bleu) else None,
        "best_valid_bleu": max(bleus) if bleus else None,
        "best_valid_loss": min((point["loss"] for point in curve), default=None),
        "last_valid_loss": curve[-1]["loss"] if curve else None,
    }


def how_training_ended(log_path: Path) -> Optional[str]:
    """'patience N' (fairseq stopped early), 'budget' (--max-epoch/--max-update reached), None (unknown/running).

    Only the log's last session counts: a resumed run appends to it.
    """
    if not Path(log_path).is_file():
        return None
    ended = None
    for line in Path(log_path).read_text(encoding="utf-8", errors="replace").splitlines():
        early = _EARLY_STOP.search(line)
        if early:
            ended = f"patience {early.group(1)}"
        elif "| fairseq_cli.train | done training in" in line:
            ended = ended or "budget"
        elif "| fairseq_cli.train | {'_name'" in line:  # fairseq's config dump: a (re)start
            ended = None
    return ended


def best_validation(curve) -> Optional[dict]:
    """The validation with the lowest loss, the last of equal bests (fairseq rewrites
    checkpoint_best.pt on a tie); None for no validation."""
    return min(reversed(curve), key=lambda point: point["loss"]) if curve else None


def run_record(run: "Run", did_not_learn: bool = False) -> dict:
    """One run as it stands: its status, every validation, where its best was, its test numbers."""
    curve = run.curve()
    best = best_validation(curve)
    status = "finished" if run.finished else ("failed" if run.failure else ("unfinished" if curve else "not started"))
    record = {"dataset": run.dataset, **({"data": run.data_name} if getattr(run, "data_name", None) else {}),
              "variant": run.variant, "layers": run.layers, "seed": run.seed, "status": status, "epochs": curve[-1]["epoch"] if curve else None,
              "ended_by": run.ended_by(),
              "best_valid_loss": best["loss"] if best else None, "best_epoch": best["epoch"] if best else None}
    if run.finished:
        result = run.result()
        record.update({column: value for column, value in run_metrics(run).items() if column.startswith("test_")})
        if did_not_learn:
            record["status"] = "finished, did not learn"
        record["checkpoint"] = Path(str(result.get("checkpoint", "?"))).name
        if "sacrebleu" in result:
            record["beam"] = dig(result, ("generation", "beam"))
            record["sacrebleu_signature"] = dig(result, ("sacrebleu", "signature"))
    if run.failure:
        record["error"] = run.failure
    record["validations"] = curve
    return record



# --- runs finished elsewhere --------------------------------------------------------------
# A matrix too big for one machine or one sitting is run in parts; each part's runs.json
# holds every finished run's record (above). Given back to the driver
# (--finished-runs), those runs are skipped and tabulated from their records: the
# checkpoints need not travel. The file is read as hostile: each record must have the
# shape run_record writes, or it is a one-line error naming the file and the run.

FINISHED_RUNS_MAX_BYTES = 64 * 1024 * 1024
FINISHED_STATUSES = ("finished", "finished, did not learn")
_ENDED_BY = re.compile(r"(patience [0-9]{1,9}|budget)")
_VALIDATION_KEYS = {"epoch", "updates", "loss", "bleu"}
# What each number of a record may be, (low, high): scores as the tools report them;
# losses in bits per token (anything above 100 is no trained model's). The bounds also
# keep means, variances and 2 ** loss within floating point.
RECORD_RANGES = {"test_bleu": (0, 100), "test_chrf": (0, 100), "test_tok_bleu": (0, 100), "test_ppl": (1, 2 ** 100),
                 "test_loss": (0, 100), "loss": (0, 100), "bleu": (0, 100)}
_COUNT_MAX = 10 ** 12


def in_range(value, low, high) -> bool:
    return is_finite_number(value) and low <= value <= high


def is_count(value, low=0, high=_COUNT_MAX) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def record_problem(record: dict) -> Optional[str]:
    """What makes a finished run's record unlike run_record's, or None."""
    if not (isinstance(record.get("dataset"), str) and record["dataset"] in configs.DATASETS):
        return "names no known dataset"
    data = record.get("data")
    if data is not None and not (isinstance(data, str) and 0 < len(data) <= 255 and data.isprintable()):
        return "has an odd data name"
    if not (isinstance(record.get("variant"), str) and record["variant"] in VARIANTS):
        return "names no known variant"
    if not is_count(record.get("layers"), 1, configs.MAX_LAYERS):
        return f"has no depth (layers) from 1 to {configs.MAX_LAYERS}"
    if not is_count(record.get("seed"), 0, 2 ** 63 - 1):
        return "has no whole-number seed"
    scores = [column for column, _ in metrics_for(record["dataset"]) if column.startswith("test_")]
    required = ("test_ppl", "test_loss") if is_language_model(record["dataset"]) else ("test_bleu", "test_chrf")
    for column in scores:
        if not (in_range(record.get(column), *RECORD_RANGES[column]) or (column not in required and record.get(column) is None)):
            low, high = RECORD_RANGES[column]
            return f"has no {column} from {low} to {high:.4g}"
    ended_by = record.get("ended_by")
    if ended_by is not None and not (isinstance(ended_by, str) and _ENDED_BY.fullmatch(ended_by)):
        return "has an ended_by that is neither 'patience N' nor 'budget'"
    checkpoint = record.get("checkpoint")
    # run_record writes the file name alone: a path here is not its record.
    if checkpoint is not None and not (isinstance(checkpoint, str) and 0 < len(checkpoint) <= 255
                                       and checkpoint.isprintable() and checkpoint == Path(checkpoint).name):
        return "has an odd checkpoint"
    signature = record.get("sacrebleu_signature")
    if signature is not None and not (isinstance(signature, str) and len(signature) <= 300 and signature.isprintable()):
        return "has an odd sacrebleu_signature"
    if record.get("beam") is not None and not is_count(record["beam"], 1, 1000):
        return "has an odd beam"
    validations = record.get("validations")
    if not isinstance(validations, list):
        return "has no list of validations"
    for point in validations:
        if not (isinstance(point, dict) and set(point) == _VALIDATION_KEYS
                and is_count(point["epoch"]) and is_count(point["updates"])
                and in_range(point["loss"], *RECORD_RANGES["loss"])
                and (point["bleu"] is None or in_range(point["bleu"], *RECORD_RANGES["bleu"]))):
            return "has a validation that is not {epoch, updates, loss from 0 to 100, bleu}"
    return None


def read_finished_runs(paths, what: str = "--finished-runs file") -> dict:
    """The finished runs of earlier runs.json files: ``{(dataset, variant, layers, seed): (record, path)}``.

    Unfinished and failed runs are left out (their checkpoints are where they ran). The
    same run finished in two files with different records is an error: which is right
    cannot be told. ``what``: how an error names a file that cannot be read.
    """
    found = {}
    for path in map(Path, paths):
        raw = read_regular_file(path, FINISHED_RUNS_MAX_BYTES, what, kind="runs.json")
        try:
            records = json.loads(raw.decode("utf-8"))
        except (ValueError, RecursionError) as err:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
            raise UserError(f"{path}: cannot be read as a runs.json ({err.__class__.__name__}): give the "
                            f"runs.json that residual-fairseq-reproduce wrote") from None
        if not isinstance(records, list) or not all(isinstance(record, dict) for record in records):
            raise UserError(f"{path}: not a list of run records: give the runs.json that residual-fairseq-reproduce wrote")
        for number, record in enumerate(records, 1):
            if record.get("status") not in FINISHED_STATUSES:
                continue
            problem = record_problem(record)
            if problem:
                raise UserError(f"{path}: run {number} {problem}: it is not a record residual-fairseq-reproduce wrote")
            key = (record["dataset"], record["variant"], record["layers"], record["seed"])
            if key in found and _comparable(found[key][0]) != _comparable(record):
                raise UserError(f"{path}: {' '.join(map(str, key))} finished differently in {found[key][1]}: "
                                f"give one of the two")
            found.setdefault(key, (record, path))
    return found


def _comparable(record: dict) -> dict:
    """A record without its status, which depends on the other runs it was tabulated with."""
    return {key: value for key, value in record.items() if key != "status"}


def result_from_record(record: dict) -> dict:
    """A finished run's record read back as the result.json that evaluation wrote for it."""
    if is_language_model(record["dataset"]):
        result = {"perplexity": record["test_ppl"], "loss_base2": record["test_loss"]}
    else:
        result = {"sacrebleu": {"score": record["test_bleu"], "signature": record.get("sacrebleu_signature")},
                  "chrf": {"score": record["test_chrf"]}, "generation": {"beam": record.get("beam")}}
        if record.get("test_tok_bleu") is not None:
            result["tokenized_bleu"] = {"score": record["test_tok_bleu"]}
    if record.get("checkpoint") is not None:
        result["checkpoint"] = record["checkpoint"]
    return result
