"""The runs of a reproduce matrix (dataset x variant x depth x seed): where each lives, whether it finished.

How a run is evaluated (the dataset's settings, and the subword method residual-fairseq-prepare
recorded) is decided here too. Layout::

    OUT/runs/<dataset>/<variant>-<L>l/seed<S>/   checkpoints, train.log, run.json, result.json
"""
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

from .. import configs, train
from ..argtypes import is_digits, is_finite_number, read_regular_file
from ..data.prepared import is_prepare_manifest, read_manifest
from ..errors import UserError
from ..language_models import check_eval_lm_extra_args
from ..training_log import validation_curve
from .records import (RECORD_RANGES, dig, how_training_ended, in_range, is_count, is_language_model, record_problem,
                      result_from_record)

RESULT_NAME = "result.json"
FAILURE_NAME = "failed.json"   # a run that failed: its error, shown in the table; removed by a later success
RESULT_MAX_BYTES = 1024 * 1024        # evaluation writes a few hundred bytes
FAILURE_MAX_BYTES = 1024 * 1024
FAILURE_MAX_CHARS = 500               # a table cell, not a log
# result.json's keys for the record columns that record_problem names.
_RESULT_KEYS = {"test_tok_bleu": "tokenized_bleu.score", "test_bleu": "sacrebleu.score", "test_chrf": "chrf.score",
                "test_ppl": "perplexity", "test_loss": "loss_base2", "an odd beam": "an odd generation.beam",
                "sacrebleu_signature": "sacrebleu.signature"}


def run_dir(out, dataset: str, variant: str, layers: int, seed: int) -> Path:
    """The directory of a run of the matrix under ``out`` (the layout above)."""
    return Path(out) / "runs" / dataset / configs.config_name(variant, layers) / f"seed{seed}"


def finished_run_keys(out) -> set:
    """(dataset, variant, layers, seed) of each run under ``out`` with a result.json, read back from
    the layout above; directories the layout does not name (``seed²``, ``notes``) are not runs."""
    keys = set()
    for result in Path(out).glob(f"runs/*/*/seed*/{RESULT_NAME}"):
        config, seed = configs.parse_config_name(result.parent.parent.name), result.parent.name[len("seed"):]
        if config and is_digits(seed):
            keys.add((result.parent.parent.parent.name, *config, int(seed)))
    return keys


def recordable_validation(point: dict) -> Optional[dict]:
    """``point`` as --finished-runs reads it back (a bleu out of range becomes None), or None
    when its loss is not a number it accepts: a diverged validation's nan would otherwise
    make the best loss depend on where it falls (min() over nan) and runs.json unreadable."""
    if not (is_count(point["epoch"]) and is_count(point["updates"]) and in_range(point["loss"], *RECORD_RANGES["loss"])):
        return None
    bleu = point["bleu"] if point["bleu"] is not None and in_range(point["bleu"], *RECORD_RANGES["bleu"]) else None
    return {**point, "bleu": bleu}


def table_cell_text(text: str) -> str:
    """``text`` on one line without '|', shortened: it goes into a markdown table cell."""
    text = " ".join("".join(char if char.isprintable() else " " for char in text).split()).replace("|", "/")
    return text if len(text) <= FAILURE_MAX_CHARS else text[:FAILURE_MAX_CHARS - 3] + "..."


@dataclass(frozen=True)
class Run:
    dataset: str
    variant: str
    layers: int
    seed: int
    data: Path
    out: Path
    # Its record in an earlier runs.json (--finished-runs), when it finished there and not
    # in ``out``: its numbers and validations come from that record.
    record: Optional[dict] = field(default=None, compare=False, repr=False)
    record_path: Optional[Path] = field(default=None, compare=False, repr=False)

    @property
    def data_name(self) -> Optional[str]:
        """The name of the data it trains on (tables and plots name it, beside the config; see
        records.data_label): the dataset residual-fairseq-prepare's manifest beside the data names,
        unless it is an own corpus (``custom``); else the data's directory (``YOUR_CORPUS`` for
        ``YOUR_CORPUS/bin``). For a run finished elsewhere, what its record says (None: an older
        record, which does not)."""
        if self.from_record:
            return self.record.get("data")
        data = Path(self.data)
        try:
            manifest = read_manifest(data.parent)
        except (UserError, OSError, ValueError):  # a damaged manifest is reported where it is used
            manifest = None
        named = manifest.get("dataset") if is_prepare_manifest(manifest) else None
        if isinstance(named, str) and named.isprintable() and 0 < len(named) <= 100 and not named.startswith("custom"):
            return named
        return (data.parent.name if data.name == "bin" and data.parent.name else data.name) or None

    @property
    def save_dir(self) -> Path:
        return run_dir(self.out, self.dataset, self.variant, self.layers, self.seed)

    @property
    def result_path(self) -> Path:
        return self.save_dir / RESULT_NAME

    @property
    def finished_here(self) -> bool:
        return self.result_path.is_file()

    @property
    def finished(self) -> bool:
        return self.finished_here or self.record is not None

    @property
    def from_record(self) -> bool:
        """Finished elsewhere and not here: tabulated from its runs.json record."""
        return self.record is not None and not self.finished_here

    @property
    def finished_where(self) -> Path:
        return self.record_path if self.from_record else self.result_path

    def curve(self) -> list:
        """Every validation of the run (see training_log.validation_curve), from its record
        when it finished elsewhere."""
        if self.from_record:
            return [dict(point) for point in self.record["validations"]]
        points = (recordable_validation(point) for point in validation_curve(self.save_dir / train.LOG_NAME))
        return [point for point in points if point is not None]

    def ended_by(self) -> Optional[str]:
        """'patience N', 'budget' or None (see records.how_training_ended)."""
        if self.from_record:
            return self.record.get("ended_by")
        return how_training_ended(self.save_dir / train.LOG_NAME)

    def result(self) -> dict:
        """result.json, checked: UserError naming it when it is not what evaluation writes."""
        if self.from_record:
            return result_from_record(self.record)
        raw = read_regular_file(self.result_path, RESULT_MAX_BYTES, "result file", kind="result.json")
        try:
            result = json.loads(raw.decode("utf-8"))
        except (ValueError, RecursionError) as err:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
            result, problem = None, f"cannot be read ({err.__class__.__name__})"
        else:
            scores = ((("perplexity",), ("loss_base2",)) if is_language_model(self.dataset)
                      else (("sacrebleu", "score"), ("chrf", "score")))
            missing = [".".join(keys) for keys in scores if not is_finite_number(dig(result, keys))]
            problem = f"has no numeric {', '.join(missing)}" if missing else self._result_problem(result)
        if problem:
            raise UserError(f"{self.result_path} {problem}: it is not a result this tool wrote; "
                            f"delete it to evaluate the run again")
        return result

    def _result_problem(self, result: dict) -> Optional[str]:
        """What in ``result`` (numbers present) its runs.json record would be refused for by
        --finished-runs: the same ranges and types, so that no table shows a score a record
        could not hold, and runs.json always loads again."""
        record = {"dataset": self.dataset, "variant": self.variant, "layers": self.layers, "seed": self.seed,
                  "validations": [], "checkpoint": Path(str(result.get("checkpoint", "?"))).name}
        if is_language_model(self.dataset):
            record.update(test_ppl=result["perplexity"], test_loss=result["loss_base2"])
        else:
            tokenized_bleu = dig(result, ("tokenized_bleu", "score"))  # optional, as run_metrics reads it
            record.update(test_bleu=result["sacrebleu"]["score"], test_chrf=result["chrf"]["score"],
                          test_tok_bleu=tokenized_bleu if is_finite_number(tokenized_bleu) else None,
                          beam=dig(result, ("generation", "beam")),
                          sacrebleu_signature=dig(result, ("sacrebleu", "signature")))
        problem = record_problem(record)
        for column, key in (_RESULT_KEYS.items() if problem else ()):
            problem = problem.replace(column, key)
        return problem

    @property
    def label(self) -> str:
        return f"{self.dataset} {self.variant} {self.layers}L seed {self.seed}"

    @property
    def failure_path(self) -> Path:
        return self.save_dir / FAILURE_NAME

    @property
    def failure(self) -> Optional[str]:
        """The error of this run's last attempt, when it failed."""
        if self.finished or not self.failure_path.is_file():
            return None
        # Read as hostile (anything may sit there): one that is not what reproduce writes says "failed".
        try:
            record = json.loads(read_regular_file(self.failure_path, FAILURE_MAX_BYTES, "failed run record")
                                .decode("utf-8"))
        except (UserError, ValueError, RecursionError):  # UnicodeDecodeError and JSONDecodeError are ValueErrors
            return "failed"
        error = record.get("error", "failed") if isinstance(record, dict) else None
        return (table_cell_text(error) or "failed") if isinstance(error, str) else "failed"


def matrix(data: dict, out: Path, variants=None, layers=None, seeds=(1,), finished_elsewhere=None) -> List[Run]:
    """Every run of the matrix; ``data`` maps each dataset to its fairseq data directory.

    ``variants`` None means every variant of each dataset's task (language models: three).
    ``layers`` None means each dataset's shipped depths; any other depth is composed
    from the dataset's base.yaml (as ``residual-fairseq-train --layers`` does).
    ``finished_elsewhere``: records.read_finished_runs of earlier runs.json
    files; a run finished in ``out`` keeps its own result.
    """
    runs = []
    elsewhere = finished_elsewhere or {}
    for dataset, data_dir in data.items():
        for depth in (layers or configs.DATASETS[dataset].depths):
            for variant in (variants or configs.DATASETS[dataset].variants):
                configs.check_choice(dataset, variant, depth, shipped_only=False)
                for seed in seeds:
                    record, path = elsewhere.get((dataset, variant, depth, seed), (None, None))
                    runs.append(Run(dataset, variant, depth, seed, Path(data_dir), Path(out), record, path))
    return runs


def train_request(run: Run, nprocs: int = 1, extra_args=(), threads=None) -> train.TrainRequest:
    return train.TrainRequest(run.dataset, run.variant, run.layers, run.data, run.save_dir, seed=run.seed,
                              nprocs=nprocs, extra_args=list(extra_args), threads=threads)


def checkpoint_to_evaluate(run: Run) -> Path:
    """checkpoint_best.pt, else (a run trained without validation has none) checkpoint_last.pt, saying so."""
    best = run.save_dir / "checkpoint_best.pt"
    if best.is_file():
        return best
    last = run.save_dir / "checkpoint_last.pt"
    if last.is_file():
        print(f"note: {run.save_dir} has no checkpoint_best.pt (trained without validation?): "
              f"evaluating checkpoint_last.pt", flush=True)
        return last
    raise UserError(f"{run.save_dir} holds neither checkpoint_best.pt nor checkpoint_last.pt")


def evaluation_options(run: Run) -> dict:
    """evaluate_run keyword arguments: the dataset's choices plus how the data were segmented."""
    options = dict(configs.DATASETS[run.dataset].evaluation)
    manifest = read_manifest(run.data.parent)  # residual-fairseq-prepare's OUT/bin layout
    if is_prepare_manifest(manifest):
        method = dig(manifest, ("subword", "method"))
        if not isinstance(method, str):
            raise UserError(f"{run.data.parent / 'manifest.json'} names no subword method: re-run "
                            f"residual-fairseq-prepare, or give data prepared elsewhere without its manifest.json")
        options["subword"] = method
        if dig(manifest, ("settings", "tokenizer")) == "moses":
            options["detok_lang"] = str(manifest["target_lang"])
    else:
        # Not prepared by us: infer from the config's validation-BLEU settings.
        task = configs.load(run.dataset, run.variant, run.layers)["task"]
        options["subword"] = {"@@ ": "subword_nmt", "sentencepiece": "sentencepiece"}.get(
            task.get("eval_bleu_remove_bpe"), "none")
        if task.get("eval_bleu_detok") == "moses":
            options["detok_lang"] = task.get("target_lang")
    return options



# evaluate_lm's keyword arguments that an evaluation override may set; "generate_args"
# (--generate-args) are its extra fairseq-eval-lm flags.
LM_EVALUATION_OPTIONS = ("tokens_per_sample", "context_window", "max_tokens", "extra_args")


def language_model_evaluation_options(dataset: str, eval_overrides=None) -> dict:
    """evaluate_lm keyword arguments: the dataset's, then ``eval_overrides`` (``generate_args``
    become the extra fairseq-eval-lm flags). A translation-only override (``beam``,
    ``lenpen``...) is refused: perplexity has no decoding to change."""
    overrides = dict(eval_overrides or {})
    if "generate_args" in overrides:
        overrides["extra_args"] = list(overrides.pop("generate_args") or ())
    unused = [key for key, value in overrides.items() if key not in LM_EVALUATION_OPTIONS and value is not None]
    if unused:
        flags = ", ".join("--" + key.replace("_", "-") for key in unused)
        raise UserError(f"{flags}: {dataset} is a language-model dataset, scored by perplexity with "
                        f"fairseq-eval-lm: there is no decoding for {flags} to change")
    options = {**configs.DATASETS[dataset].evaluation, **overrides}
    options = {key: value for key, value in options.items() if key in LM_EVALUATION_OPTIONS}
    check_eval_lm_extra_args(options.get("extra_args", ()))
    return options
