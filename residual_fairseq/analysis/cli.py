"""``residual-fairseq-analyze``: gradient vanishing and representation collapse, measured."""
import argparse
import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

from ..argtypes import (MAX_SEED, check_output_dir, finite_float, int_at_least, nonnegative_float, positive_float,
                        read_regular_file, refuse_repeats)
from ..atomic import give_default_permissions
from ..configs import MAX_LAYERS
from ..errors import UserError, cli_main
from ..fairseq_data import is_language_modeling, load_task
from ..model_memory import check_fits_memory
from ..runtime import add_threads_flag, add_verbose_flag, use_threads
from ..variants import LM_VARIANTS, VARIANTS
from .data import measurement_batches, training_batches
from .models import fresh_model, load_checkpoint
from .report import TABLES, runs_from_dict, write_figures, write_tables
from .training import TrainingSettings, build_label_smoothed_criterion, train_and_measure

EXAMPLE = """example (24-layer narrow models on the prepared sample corpus, 300 updates; docs/diagnostics.md):
  residual-fairseq-analyze data/sample.prepared/bin --out analysis --layers 24 \\
      --embed-dim 64 --ffn-dim 256 --heads 4 --train-steps 300 --measure-every 50 \\
      --lr 1e-3 --warmup-updates 100 --max-tokens 1536 --batches 2
"""


def build_parser():
    p = argparse.ArgumentParser(
        prog="residual-fairseq-analyze", description=__doc__, epilog=EXAMPLE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("data", nargs="?", help="fairseq-preprocess output dir (e.g. from residual-fairseq-prepare)")
    p.add_argument("--out", required=True, help="output dir: analysis.json, *.csv, *.png")
    p.add_argument("--merge", nargs="+", action="extend", metavar="ANALYSIS_JSON",
                   help="instead of measuring, combine earlier outputs (e.g. one per variant, "
                        "run in parallel) into one report and its figures")
    # -s/-t as in residual-fairseq-train, whose pair check (and its messages) this tool shares
    p.add_argument("-s", "--source-lang")
    p.add_argument("-t", "--target-lang")
    g = p.add_argument_group("models")
    g.add_argument("--variants", nargs="*", action="extend", choices=VARIANTS, default=None,
                   help="fresh models to build (default: all of them, or none when --checkpoint is given)")
    g.add_argument("--checkpoint", action="append", default=[], metavar="LABEL=PATH",
                   help="also analyse a trained checkpoint under LABEL (repeatable); "
                        "labels that name a variant (post_ln, deepnet, ...) get that variant's colour")
    g.add_argument("--preset", default="", help="fairseq architecture suffix the sizes start from, "
                                                "e.g. iwslt_de_en (default: transformer base)")
    g.add_argument("--layers", type=int, help="encoder and decoder layers")
    g.add_argument("--encoder-layers", type=int)
    g.add_argument("--decoder-layers", type=int)
    g.add_argument("--embed-dim", type=int)
    g.add_argument("--ffn-dim", type=int)
    g.add_argument("--heads", type=int)
    g.add_argument("--dropout", type=finite_float)
    g.add_argument("--dual-scale", type=finite_float, help="ResiDual dual-stream scale s (default 1.0)")
    g.add_argument("--seed", type=int_at_least(0, MAX_SEED), default=1, help="initialisation and batch-order seed")
    g = p.add_argument_group("measurement")
    g.add_argument("--split", default="valid", help="split the measurement batches come from")
    g.add_argument("--batches", type=int, default=4, help="measurement batches (the same ones every time)")
    g.add_argument("--max-tokens", type=int, default=4096)
    g.add_argument("--label-smoothing", type=finite_float, help="default 0.1 (translation), 0 (language models)")
    g.add_argument("--tokens-per-sample", type=int, default=128,
                   help="language models (a data dir with one dict.txt): block length")
    g = p.add_argument_group("training (optional)")
    g.add_argument("--train-steps", type=int, default=0, help="updates on the train split (default 0)")
    g.add_argument("--measure-every", type=int, default=100)
    g.add_argument("--lr", type=positive_float, default=5e-4)
    g.add_argument("--warmup-updates", type=int, default=4000)
    g.add_argument("--clip-norm", type=nonnegative_float, default=0.0)
    add_threads_flag(p)
    add_verbose_flag(p)
    return p


def parse_checkpoints(specs):
    checkpoints = {}
    for spec in specs:
        label, sep, path = spec.partition("=")
        if not sep or not label or not path:
            raise UserError(f"--checkpoint expects LABEL=PATH, got {spec!r}")
        if label in checkpoints:
            raise UserError(f"--checkpoint label {label!r} given twice")
        checkpoints[label] = path
    return checkpoints


def check_args(args):
    refuse_repeats(args.variants or (), "--variants")  # built and measured twice, two runs of one label
    for name in ("layers", "encoder_layers", "decoder_layers", "embed_dim", "ffn_dim", "heads",
                 "batches", "max_tokens", "measure_every", "tokens_per_sample"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise UserError(f"--{name.replace('_', '-')} must be at least 1, got {value}")
    if args.train_steps < 0:
        raise UserError(f"--train-steps must be 0 or more, got {args.train_steps}")
    if args.embed_dim and args.heads and args.embed_dim % args.heads:
        raise UserError(f"--embed-dim {args.embed_dim} is not divisible by --heads {args.heads}")
    for name in ("layers", "encoder_layers", "decoder_layers"):
        value = getattr(args, name)
        if value is not None and value > MAX_LAYERS:
            raise UserError(f"--{name.replace('_', '-')} must be at most {MAX_LAYERS}, got {value}")
    if args.dual_scale is not None and args.dual_scale <= 0:
        raise UserError(f"--dual-scale must be a finite positive number, got {args.dual_scale}")
    if args.dropout is not None and not 0 <= args.dropout < 1:
        raise UserError(f"--dropout must be in [0, 1), got {args.dropout}")
    if args.label_smoothing is not None and not 0 <= args.label_smoothing < 1:
        raise UserError(f"--label-smoothing must be in [0, 1), got {args.label_smoothing}")
    if args.warmup_updates < 0:
        raise UserError(f"--warmup-updates must be 0 or more, got {args.warmup_updates}")
    check_model_fits_memory(args)


def check_model_fits_memory(args):
    """Refuse a model whose weights, gradients and Adam state alone exceed this machine's memory."""
    embed = args.embed_dim or 512
    check_fits_memory(args.encoder_layers or args.layers or 6, args.decoder_layers or args.layers or 6, embed,
                      args.ffn_dim or 4 * embed)


# Every name write_tables and write_figures give a file: an earlier output holding only
# these is replaced whole; anything else in the dir is the user's, and refused.
OWN_FILE_NAMES = re.compile("|".join([
    r"analysis\.json", r"loss\.csv", r"training\.csv", *(re.escape(name) for name in TABLES),
    r"(gradient_norms|similarity)_update\d+\.png", r"dual_stream\.png", r"training\.png",
]))


def foreign_entry(out: Path):
    """The first entry of ``out`` this tool would not have written (a symlink, a subdir, another
    name), or None: replacing ``out`` deletes its old entries."""
    for entry in sorted(os.scandir(out), key=lambda entry: entry.name):
        if not (OWN_FILE_NAMES.fullmatch(entry.name) and entry.is_file(follow_symlinks=False)):
            return entry.name
    return None


def check_replaceable(out: Path) -> None:
    """Refuse an ``out`` that is not a dir, or not empty and not only an earlier analysis output."""
    if not out.exists():
        return
    if not out.is_dir():
        raise UserError(f"--out {out} is not a directory")
    entries = list(out.iterdir())
    if entries and not (out / "analysis.json").exists():
        raise UserError(f"--out {out} exists and is not an earlier analysis output; choose another dir")
    foreign = foreign_entry(out)
    if foreign is not None:
        raise UserError(f"--out {out} holds {foreign}, which residual-fairseq-analyze did not write; "
                        "move it or choose another dir")


def prepare_out_dir(out: Path) -> Path:
    """A fresh temporary dir beside ``out``; refuses to overwrite anything but an old analysis."""
    check_output_dir(out, "--out")
    check_replaceable(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    give_default_permissions(tmp, directory=True)  # it becomes the user's output dir
    return tmp


def publish(tmp: Path, out: Path) -> None:
    """Move the finished output into place; an old output is replaced, never mixed in."""
    # Measuring takes minutes: the user may have put something into out meanwhile.
    check_replaceable(out)
    if out.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
        os.replace(out, old / out.name)
        os.replace(tmp, out)
        shutil.rmtree(old)
    else:
        os.replace(tmp, out)


@cli_main
def main(argv=None):
    args = build_parser().parse_args(argv)
    # (importing fairseq leaves the root logger at DEBUG: cli_main resets it, see errors.configure_logging)
    check_args(args)
    check_output_dir(Path(args.out), "--out")
    if args.merge:
        refuse_inputs_in_out(args.merge, Path(args.out))
        return merge_reports(args.merge, Path(args.out))
    if not args.data:
        raise UserError("give a data dir (or --merge earlier analysis.json files)")
    checkpoints = parse_checkpoints(args.checkpoint)
    if args.variants is not None and not args.variants and not checkpoints:
        raise UserError("nothing to analyse: give --variants and/or --checkpoint")
    # Measuring beside a training run on a small machine, torch's thread-per-core default
    # oversubscribes the cores (measured here: ~10x slower than one thread).
    use_threads(args.threads)
    task = load_task(args.data, args.source_lang, args.target_lang, args.tokens_per_sample)
    all_variants = LM_VARIANTS if is_language_modeling(task) else VARIANTS
    variants = args.variants if args.variants is not None else ([] if checkpoints else list(all_variants))
    unsupported = [variant for variant in variants if variant not in all_variants]
    if unsupported:
        raise UserError(f"--variants {' '.join(unsupported)}: language models come as {', '.join(LM_VARIANTS)}")
    probe_batches = measurement_batches(task, args.split, args.max_tokens, args.batches)
    if args.label_smoothing is None:
        args.label_smoothing = 0.0 if is_language_modeling(task) else 0.1
    criterion = build_label_smoothed_criterion(task, args.label_smoothing)
    settings = TrainingSettings(
        steps=args.train_steps, measure_every=args.measure_every, lr=args.lr,
        warmup_updates=args.warmup_updates, clip_norm=args.clip_norm, max_tokens=args.max_tokens,
    )
    sizes = dict(
        encoder_layers=args.encoder_layers or args.layers, decoder_layers=args.decoder_layers or args.layers,
        embed_dim=args.embed_dim, ffn_dim=args.ffn_dim, heads=args.heads, dropout=args.dropout,
    )
    models = {}
    # Admin's omegas are profiled on the first training batch, as its training starts.
    first_train_batch = (lambda: [next(training_batches(task, "train", args.max_tokens, args.seed))]) \
        if "admin" in variants else None
    for variant in variants:
        models[variant] = lambda v=variant: fresh_model(
            v, task, seed=args.seed, preset=args.preset, dual_scale=args.dual_scale,
            profile_batches=first_train_batch() if v == "admin" else None, **sizes)
    for label, path in checkpoints.items():
        if label in models:
            raise UserError(f"label {label!r} names both a fresh variant and a checkpoint")
        models[label] = lambda p=path: load_checkpoint(p, task)

    def measure_all():
        for label, build in models.items():
            print(f"analysing {label} ...", flush=True)
            train_batches = training_batches(task, "train", args.max_tokens, args.seed) if args.train_steps else None
            run = train_and_measure(label, build(), criterion, probe_batches, train_batches, settings)
            print(describe_loss(run), flush=True)
            yield run

    record = {k: v for k, v in vars(args).items() if k not in ("out", "merge")}
    write_report(measure_all, record, Path(args.out))


def describe_loss(run) -> str:
    """One line: the last measured loss, and what the source is worth to it."""
    last = run.measurements[-1]
    line = f"{run.label}: loss {last.loss:.3f} bits/token" + (f" after {run.steps[-1]} updates" if run.steps[-1] else "")
    if last.loss_other_source is not None:
        # round, then add 0.0: a gain of -0.0004 bits reads 0.000, not -0.000
        line += (f"; {last.loss_other_source:.3f} with other sentences' sources "
                 f"(the source is worth {round(last.source_gain, 3) + 0.0:.3f} bits)")
    return line


MAX_REPORT_BYTES = 256 << 20   # an analysis.json of many deep runs is a few MiB


def refuse_inputs_in_out(paths, out: Path) -> None:
    """A --merge file inside --out (or linked from there) would be replaced by the merged report."""
    out = Path(os.path.realpath(out))
    for path in paths:
        if out in Path(os.path.realpath(path)).parents:
            raise UserError(f"--merge {path} is inside --out {out}, which the merged report replaces: "
                            "choose another --out")


def merge_reports(paths, out: Path):
    runs, settings = [], []
    for path in paths:
        try:
            # (a FIFO would block and /dev/zero never end: regular files only, read with a bound)
            data = read_regular_file(path, MAX_REPORT_BYTES, "--merge", error=ValueError, kind="analysis.json")
            report = json.loads(data.decode("utf-8"))
            runs += runs_from_dict(report)
        except RecursionError:  # json's parser recurses once per nesting level
            raise UserError(f"cannot read {path} as an analysis.json: it is nested too deeply") from None
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise UserError(f"cannot read {path} as an analysis.json: {err}") from None
        settings.append(report.get("settings"))
    measured = {tuple(run.measurements[0].stacks) for run in runs}
    if len(measured) > 1:
        raise UserError("--merge: the files measure different stacks (a language model's decoder and a "
                        "translation model's encoder and decoder?): merge like with like")
    labels = [run.label for run in runs]
    if len(set(labels)) != len(labels):
        raise UserError(f"--merge: run labels repeat across the files: {', '.join(labels)}")
    write_report(lambda: runs, {"merged_from": [str(p) for p in paths], "settings": settings}, out)


def write_report(produce_runs, settings, out: Path):
    """Runs ``produce_runs()`` and writes its report into ``out`` as one complete unit."""
    # A symlinked out stays the user's link: the dir it names is the one replaced.
    out_dir = Path(os.path.realpath(out)) if out.is_symlink() else out
    tmp = prepare_out_dir(out_dir)
    try:
        runs = list(produce_runs())
        write_tables(runs, settings, tmp)
        figures = write_figures(runs, tmp)
        publish(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    print(f"wrote {out}/analysis.json, gradients.csv, similarity.csv, dual_stream.csv, loss.csv, training.csv, "
          + ", ".join(figures))


if __name__ == "__main__":
    sys.exit(main())
