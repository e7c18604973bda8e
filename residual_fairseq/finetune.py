"""Fine-tune a trained model on a new language pair (or new data) with its own vocabulary.

A checkpoint only understands the token ids of the dictionaries it was trained
with, so the new data are prepared with the *original* subword model and
dictionaries (:mod:`residual_fairseq.data`, ``subword_model``/``srcdict``/``tgtdict``),
checked against the checkpoint's embedding tables, and trained with the same config
plus ``--finetune-from-model`` (fairseq loads the weights, resets optimizer, schedule
and data position; a later call resumes from the new ``checkpoint_last.pt``).

``--save-dir`` must be a directory of this fine-tune's own: fairseq ignores
``--finetune-from-model`` when ``SAVE_DIR/checkpoint_last.pt`` exists (it resumes that
run instead) and writes ``checkpoint_best.pt``/``checkpoint_last.pt`` over what is
there. So the checkpoint's own directory, one holding the checkpoint file, and one
holding checkpoints (``checkpoint*.pt``) of any other run are refused; one whose
``run.json`` records this fine-tune (the same checkpoint and ``--data-out``) is resumed.

Where everything comes from, by default: ``run.json`` beside the checkpoint (written
by ``residual-fairseq-train``) names the config and the original data directory,
whose ``manifest.json`` names the subword model.

CLI (the bundled sample: an es->en model fine-tuned on en->es)::

    residual-fairseq-finetune --checkpoint checkpoints/sample/checkpoint_best.pt \\
        --dataset sample-es-en --source-lang en --target-lang es \\
        --data-out data/sample-en-es --save-dir checkpoints/sample-en-es -- --max-epoch 1
"""
import argparse
import filecmp
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

from . import configs, train
from .argtypes import check_output_dir, is_digits, positive_int, same_file
from .data.binarized import dictionary_size
from .errors import UserError, cli_main
from .passthrough import flag_values, refuse_flags, split_passthrough
from .run_record import read_any_run_record, read_run_record
from .runtime import add_verbose_flag
from .checkpoints import read_checkpoint


class VocabularyMismatch(UserError):
    """The new data cannot be expressed in the checkpoint's vocabulary."""


@dataclass
class OriginalVocabulary:
    """The subword model and per-language dictionaries a model was trained with."""

    directory: Path                 # the prepared directory (manifest.json, bin/)
    subword_model: Optional[Path]   # None: the data were not subword-segmented
    dictionaries: dict              # language -> dict.<lang>.txt

    @classmethod
    def from_prepared(cls, directory) -> "OriginalVocabulary":
        from .data import read_manifest
        from .data.prepared import is_prepare_manifest

        directory = Path(directory)
        manifest = read_manifest(directory)
        if manifest is None:
            raise UserError(f"{directory} has no manifest.json: pass --vocab-from with the directory "
                            "residual-fairseq-prepare wrote for the original model")
        if not is_prepare_manifest(manifest):
            raise UserError(f"{directory}/manifest.json is not one residual-fairseq-prepare wrote: pass --vocab-from "
                            "with the directory it wrote for the original model")
        if manifest.get("task") == "language_modeling":
            raise UserError(f"{directory} holds a language-model preparation (one language): fine-tuning a "
                            "translation model needs the translation pair's prepared directory")
        model = manifest.get("subword", {}).get("model")
        languages = (manifest["source_lang"], manifest["target_lang"])
        dictionaries = {lang: directory / "bin" / f"dict.{lang}.txt" for lang in languages}
        return cls(directory, directory / model if model else None, dictionaries)

    @property
    def joined(self) -> bool:
        first, second = self.dictionaries.values()
        return filecmp.cmp(first, second, shallow=False)

    def dictionary_for(self, lang: str) -> Path:
        """The dictionary to binarize ``lang`` with; a one-line error when there is none."""
        if lang in self.dictionaries:
            return self.dictionaries[lang]
        if self.joined:
            # One joined dictionary serves any language (unknown pieces become <unk>).
            return next(iter(self.dictionaries.values()))
        known = " and ".join(self.dictionaries)
        raise VocabularyMismatch(f"vocabularies incompatible: the model has separate {known} dictionaries, "
                                 f"none for {lang!r} (train a new model, or one with a joined dictionary)")


def embedding_rows(checkpoint: Path) -> dict:
    """Rows of the checkpoint's source and target embedding tables (the file is checked
    before it is unpickled: :func:`~residual_fairseq.checkpoints.read_checkpoint`)."""
    weights = read_checkpoint(checkpoint)["model"]
    rows = {}
    for side, key in (("source", "encoder.embed_tokens.weight"), ("target", "decoder.embed_tokens.weight")):
        if key not in weights:
            raise UserError(f"{checkpoint} has no {key}: not a fairseq translation checkpoint")
        rows[side] = weights[key].shape[0]
    return rows


def check_compatible(checkpoint: Path, srcdict: Path, tgtdict: Path, rows: Optional[dict] = None) -> None:
    """Raise :class:`VocabularyMismatch` unless the dictionaries fit the checkpoint's embeddings
    (``rows``: :func:`embedding_rows` of the checkpoint, if already known)."""
    rows = rows or embedding_rows(checkpoint)
    for side, path in (("source", srcdict), ("target", tgtdict)):
        size = dictionary_size(path)  # fairseq's parser, its complaints as one line
        if size != rows[side]:
            raise VocabularyMismatch(f"vocabularies incompatible: {checkpoint} has {rows[side]} {side} embeddings "
                                     f"but {path} has {size} entries")


@dataclass
class FinetuneRequest:
    checkpoint: Path
    dataset: str                        # a data recipe: sample-es-en, iwslt14-de-en, custom, ...
    source_lang: str
    target_lang: str
    data_out: Path                      # where the new pair is prepared
    save_dir: Path
    vocab_from: Optional[Path] = None   # the original prepared directory (default: from run.json)
    config: Optional[tuple] = None      # (dataset, variant, layers) of the original training
    corpus: dict = field(default_factory=dict)  # custom corpora: train/valid/test file lists
    nprocs: int = 1
    extra_args: List[str] = field(default_factory=list)


def original_run(request: FinetuneRequest):
    """(config triple, original prepared directory) of the checkpoint's training."""
    record = {}
    if request.config is None or request.vocab_from is None:
        try:
            record = read_run_record(Path(request.checkpoint).parent) or {}
        except UserError as err:
            raise UserError(f"{err}; pass --train-config DATASET VARIANT LAYERS and --vocab-from "
                            "ORIGINAL_PREPARED_DIR instead") from None
    config = request.config or ((record["dataset"], record["variant"], record["layers"],
                                 record.get("decoder_layers") or record["layers"]) if record else None)
    if config is None:
        raise UserError(f"no run.json beside {request.checkpoint}: pass --train-config DATASET VARIANT LAYERS")
    vocab_from = request.vocab_from or (Path(record["data"]).parent if record else None)
    if vocab_from is None:
        raise UserError(f"no run.json beside {request.checkpoint}: pass --vocab-from ORIGINAL_PREPARED_DIR")
    return config, Path(vocab_from)


# Model settings that must agree between a config and a checkpoint for the weights to load
# (fairseq otherwise stops with "please ensure that the architectures match" and a traceback).
MATCHED_SETTINGS = train.SIZE_FLAGS + ("encoder_normalize_before", "decoder_normalize_before")


def checkpoint_model_settings(checkpoint: Path) -> dict:
    """The model settings stored in a fairseq checkpoint (its cfg.model), as a dict."""
    state = read_checkpoint(checkpoint)
    model = (state.get("cfg") or {}).get("model") if isinstance(state.get("cfg"), dict) else None
    if model is None and state.get("args") is not None:
        model = state["args"]
    if model is None:
        raise UserError(f"{checkpoint} records no model settings (cfg.model): not a fairseq checkpoint")
    values = vars(model) if hasattr(model, "__dict__") and not isinstance(model, dict) else dict(model)
    values.setdefault("arch", values.get("_name"))
    return values


def model_class(arch: str):
    """The model class an architecture name builds (presets of one model differ only in defaults)."""
    from fairseq.models import ARCH_MODEL_REGISTRY

    return ARCH_MODEL_REGISTRY.get(arch, arch)


def check_config_matches_checkpoint(checkpoint: Path, settings: dict, extra_args=()) -> None:
    """A one-line UserError when the training config would build another model than the checkpoint's."""
    wanted = train.effective_model(settings, extra_args)
    for key, value in settings["model"].items():
        wanted.setdefault(key, value)
    stored = checkpoint_model_settings(checkpoint)
    differences = []
    if wanted.get("arch") and stored.get("arch") and model_class(wanted["arch"]) is not model_class(stored["arch"]):
        differences.append(f"arch {stored['arch']} vs {wanted['arch']}")
    for key in MATCHED_SETTINGS:
        if key in stored and wanted.get(key) is not None and str(stored[key]) != str(wanted[key]):
            differences.append(f"{key} {stored[key]} vs {wanted[key]}")
    if differences:
        raise UserError(f"the training config does not match {checkpoint} (checkpoint vs config: "
                        f"{', '.join(differences)}): pass the --train-config it was trained with")


FINETUNE_OWN_FLAGS = ("--finetune-from-model", "--restore-file")


# --- the save directory ---------------------------------------------------------------------

CHECKPOINT_GLOB = "checkpoint*.pt"  # what fairseq-train writes (and resumes from: checkpoint_last.pt)


def recorded_finetune(save_dir: Path) -> Optional[tuple]:
    """(resolved checkpoint, data directory) of the fine-tune that ``SAVE_DIR/run.json`` records;
    None when there is no such record (none, unreadable, or a plain training run's)."""
    record = read_any_run_record(save_dir)
    if not isinstance(record, dict) or not isinstance(record.get("data"), str):
        return None
    extra_args = record.get("extra_args")
    starts = flag_values(extra_args, "--finetune-from-model") if isinstance(extra_args, list) else []
    if not starts or not isinstance(starts[0], str):  # the first one is finetune's own
        return None
    return Path(starts[0]), Path(record["data"])


def check_save_dir(request: FinetuneRequest) -> None:
    """Refuse a ``--save-dir`` where fairseq would not fine-tune the checkpoint, or would write over it.

    Refused: the checkpoint's own directory; a directory holding the checkpoint file
    (under any name, also as a link); one holding fairseq checkpoints (``checkpoint*.pt``)
    that its ``run.json`` does not record as a fine-tune of this same checkpoint into
    this same ``--data-out`` (only that one is resumed, as fairseq does from
    ``checkpoint_last.pt``). Nothing is read but the directory listing and run.json.
    """
    save_dir = Path(request.save_dir)
    if not save_dir.is_dir():
        return
    checkpoint = Path(request.checkpoint).resolve()
    if save_dir.resolve() == checkpoint.parent:
        raise UserError(f"--save-dir {save_dir} is the directory of --checkpoint {request.checkpoint}: fine-tuning "
                        "would write checkpoint_best.pt and checkpoint_last.pt there, over the model it starts "
                        "from (or resume that run instead); choose another --save-dir")
    holding = next((entry for entry in sorted(save_dir.iterdir()) if same_file(entry, checkpoint)), None)
    if holding is not None:
        raise UserError(f"--save-dir {save_dir} holds --checkpoint {request.checkpoint} (as {holding.name}): "
                        "fine-tuning could write over it; choose another --save-dir")
    found = sorted(path.name for path in save_dir.glob(CHECKPOINT_GLOB))
    if not found:
        return
    this_run = (checkpoint, Path(request.data_out).resolve() / "bin")
    if recorded_finetune(save_dir) == this_run:
        return  # an earlier run of this fine-tune: fairseq resumes it from checkpoint_last.pt
    named = found[0] + (f" and {len(found) - 1} more" if len(found) > 1 else "")
    consequence = ("fairseq would resume that run from checkpoint_last.pt instead of fine-tuning "
                   f"{request.checkpoint}" if "checkpoint_last.pt" in found else "fine-tuning would write over them")
    raise UserError(f"--save-dir {save_dir} holds checkpoints of another run ({named}; its run.json records no "
                    f"fine-tune of {request.checkpoint} into this --data-out): {consequence}; choose an empty "
                    "--save-dir")


# --- data ------------------------------------------------------------------------------------

# prepare's advice names its own flags (--out, --force); finetune has --data-out and no --force.
_PREPARE_ADVICE = (
    (re.compile(r": choose another --out or pass --force to replace it$"),
     ": choose another --data-out (finetune does not replace an existing directory)"),
    (re.compile(r"(?<![\w-])--out(?![\w-])"), "--data-out"),
)


def in_finetune_terms(message: str) -> str:
    """A data preparation error, reworded with finetune's flags instead of prepare's."""
    for pattern, replacement in _PREPARE_ADVICE:
        message = pattern.sub(replacement, message)
    return message


def prepare_new_pair(request: FinetuneRequest, vocabulary: OriginalVocabulary, rows: Optional[dict] = None) -> Path:
    """Prepare the new pair with the original subword model and dictionaries; returns bin/."""
    from .data import DataPreparationError, PrepareOptions, prepare

    srcdict = vocabulary.dictionary_for(request.source_lang)
    tgtdict = vocabulary.dictionary_for(request.target_lang)
    check_compatible(Path(request.checkpoint), srcdict, tgtdict, rows)
    options = PrepareOptions(
        dataset=request.dataset, out=Path(request.data_out), source_lang=request.source_lang,
        target_lang=request.target_lang, subword_model=vocabulary.subword_model,
        subword=None if vocabulary.subword_model else "none", srcdict=srcdict, tgtdict=tgtdict,
        **{split: [Path(p) for p in paths] for split, paths in request.corpus.items()},
    )
    try:
        return prepare(options).bin_dir
    except DataPreparationError as err:
        raise DataPreparationError(in_finetune_terms(str(err))) from None


def finetune(request: FinetuneRequest, dry_run: bool = False) -> train.TrainPlan:
    """Prepare the new pair (also in a dry run: training needs its dictionaries) and train."""
    if Path(request.checkpoint).is_dir():
        raise UserError(f"--checkpoint {request.checkpoint} is a directory: give a checkpoint file "
                        f"(e.g. {Path(request.checkpoint) / 'checkpoint_best.pt'})")
    if not Path(request.checkpoint).is_file():
        raise UserError(f"checkpoint not found: {request.checkpoint}")
    # finetune gives fairseq-train --finetune-from-model itself: another one after -- would win
    # (fairseq takes the last), or --restore-file would start from elsewhere, while run.json
    # and the checks above name --checkpoint.
    refuse_flags(request.extra_args, FINETUNE_OWN_FLAGS,
                 "after --: residual-fairseq-finetune starts from --checkpoint itself")
    check_output_dir(request.save_dir, "--save-dir")
    check_output_dir(request.data_out, "--data-out")
    check_save_dir(request)  # before anything is read or written (also in a dry run)
    rows = embedding_rows(Path(request.checkpoint))  # checks the checkpoint before anything is written
    config, vocab_from = original_run(request)
    dataset, variant, layers = config[:3]
    decoder_layers = int(config[3]) if len(config) > 3 else int(layers)
    configs.check_choice(dataset, variant, int(layers), shipped_only=False)
    settings = configs.load(dataset, variant, int(layers), decoder_layers=decoder_layers)
    check_config_matches_checkpoint(Path(request.checkpoint), settings, request.extra_args)
    vocabulary = OriginalVocabulary.from_prepared(vocab_from)
    print(f"fine-tuning {variant} {layers}L ({dataset} config) on {request.dataset} "
          f"{request.source_lang}->{request.target_lang} with the vocabulary of {vocab_from}", flush=True)
    bin_dir = prepare_new_pair(request, vocabulary, rows)
    train_request = train.TrainRequest(
        dataset, variant, int(layers), bin_dir, Path(request.save_dir), nprocs=request.nprocs,
        source_lang=request.source_lang, target_lang=request.target_lang, decoder_layers=decoder_layers,
        extra_args=["--finetune-from-model", str(Path(request.checkpoint).resolve())] + list(request.extra_args),
    )
    return train.train(train_request, dry_run=dry_run)


def build_parser():
    parser = argparse.ArgumentParser(
        prog="residual-fairseq-finetune",
        description="Prepare a new language pair with a trained model's subword model and dictionaries, "
                    "then fine-tune it (--finetune-from-model). Flags after -- go to fairseq-train.",
    )
    parser.add_argument("--checkpoint", required=True, type=Path, help="the trained model, e.g. checkpoint_best.pt")
    parser.add_argument("--dataset", required=True, help="data recipe of the new pair (see residual-fairseq-prepare)")
    parser.add_argument("--source-lang", "-s", required=True)
    parser.add_argument("--target-lang", "-t", required=True)
    parser.add_argument("--data-out", required=True, type=Path, help="where to prepare the new pair")
    parser.add_argument("--save-dir", required=True, type=Path, help="fine-tuned checkpoints go here")
    parser.add_argument("--vocab-from", type=Path,
                        help="the original prepared directory (default: from run.json beside the checkpoint)")
    parser.add_argument("--train-config", nargs=3, metavar=("DATASET", "VARIANT", "LAYERS"),
                        help="the original training config (default: from run.json beside the checkpoint)")
    for split in ("train", "valid", "test"):
        parser.add_argument(f"--{split}", nargs="+", action="extend", default=[], metavar="FILE",
                            help=f"--dataset custom: {split} data as SRC_FILE TGT_FILE or one TSV")
    parser.add_argument("--nprocs", type=positive_int, default=1)
    parser.add_argument("--dry-run", action="store_true", help="prepare the data, print the training command")
    add_verbose_flag(parser)
    return parser


@cli_main
def main(argv=None):
    ours, passthrough = split_passthrough(argv)
    args = build_parser().parse_args(ours)
    config = None
    if args.train_config:
        dataset, variant, layers = args.train_config
        if not is_digits(layers) or int(layers) < 1:
            raise UserError(f"--train-config LAYERS must be a positive number, got {layers!r}")
        config = (dataset, variant, int(layers))
    corpus = {split: getattr(args, split) for split in ("train", "valid", "test") if getattr(args, split)}
    request = FinetuneRequest(args.checkpoint, args.dataset, args.source_lang, args.target_lang, args.data_out,
                              args.save_dir, args.vocab_from, config, corpus, args.nprocs, passthrough)
    finetune(request, dry_run=args.dry_run)


if __name__ == "__main__":
    main()
