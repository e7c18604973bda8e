"""residual-fairseq-reproduce: the command line that runs a matrix and tabulates it."""
import argparse
import shlex
from pathlib import Path
from typing import List

from .. import configs
from ..argtypes import MAX_SEED, check_output_dir, int_at_least, positive_int, refuse_repeats, same_file, shell_words
from ..errors import UserError, cli_main
from ..passthrough import flag_given, flag_value, split_passthrough
from ..run_inputs import data_input_files
from ..run_record import recorded_extra_args
from ..runtime import add_threads_flag, add_verbose_flag
from ..variants import VARIANTS
from .extend import larger_budget, set_aside, trains_on
from .records import read_finished_runs
from .report import REPORT_NAMES, write_reports
from .runs import Run, matrix
from .schedule import check_evaluation_options, check_passthrough, reproduce


def parse_data(values, datasets) -> dict:
    """``--data DIR`` (one dataset) or ``--data DATASET=DIR`` (any number)."""
    data = {}
    for value in values:
        dataset, sep, directory = value.partition("=")
        if not sep:
            if len(datasets) != 1:
                raise UserError("with several --dataset values give --data DATASET=DIR for each")
            dataset, directory = datasets[0], value
        if dataset in data:  # the later directory would silently win
            raise UserError(f"--data names {dataset} twice ({data[dataset]}, {directory}): give each dataset "
                            "one data directory")
        data[dataset] = directory
    missing = [dataset for dataset in datasets if dataset not in data]
    unknown = [dataset for dataset in data if dataset not in datasets]
    if missing or unknown:
        raise UserError(f"--data must name each --dataset once (missing: {', '.join(missing) or '-'}; "
                        f"not in --dataset: {', '.join(unknown) or '-'})")
    return {dataset: data[dataset] for dataset in datasets}


def build_parser():
    parser = argparse.ArgumentParser(
        prog="residual-fairseq-reproduce",
        description="Train and evaluate dataset x variant x depth x seed, skipping finished runs, "
                    "and tabulate mean ± std over seeds. Flags after -- go to every fairseq-train.",
    )
    # Every list flag is action="extend": given twice, it keeps both lists (argparse's default
    # keeps the last one and silently drops the rest, e.g. one of two --finished-runs files).
    parser.add_argument("--dataset", nargs="+", action="extend", required=True, choices=list(configs.DATASETS))
    parser.add_argument("--data", nargs="+", action="extend", required=True, metavar="[DATASET=]DIR",
                        help="fairseq data directory (the prepared bin/) of each dataset")
    parser.add_argument("--variants", nargs="+", action="extend", choices=VARIANTS,
                        help="default: every variant of each dataset's task (language models: post_ln pre_ln resi_dual)")
    parser.add_argument("--layers", nargs="+", action="extend", type=int_at_least(1, configs.MAX_LAYERS),
                        help="depths, any (default: each dataset's shipped depths)")
    parser.add_argument("--seeds", nargs="+", action="extend", type=int_at_least(0, MAX_SEED), help="default: 1")
    parser.add_argument("--out", required=True, help="runs and reports go here")
    parser.add_argument("--finished-runs", nargs="+", action="extend", default=[], metavar="RUNS_JSON",
                        help="runs.json of earlier parts of the matrix (another machine, another --out): "
                             "the runs finished there are skipped and tabulated from it, without their "
                             "checkpoints")
    parser.add_argument("--nprocs", type=positive_int, default=1, help="processes per training (see residual-fairseq-train)")
    parser.add_argument("--beam", type=int_at_least(1, 1000),
                        help="test-set beam size (default: the dataset's; translation only)")
    parser.add_argument("--generate-args", type=shell_words, default=[],
                        help='extra fairseq-generate flags for the test set, e.g. "--max-len-b 50" (language '
                             'models: extra fairseq-eval-lm flags)')
    add_threads_flag(parser)
    add_verbose_flag(parser)
    parser.add_argument("--jobs", type=positive_int, default=1,
                        help="runs at a time, each with --threads threads (default: the cores shared out); "
                             "on one GPU they share it")
    parser.add_argument("--no-report", action="store_true", help=argparse.SUPPRESS)  # a --jobs run: its parent reports
    parser.add_argument("--report-only", action="store_true", help="only (re)write the tables and plot")
    parser.add_argument("--dry-run", action="store_true", help="print every command without running")
    parser.add_argument("--no-warmup", action="store_true",
                        help="train without learning-rate warm-up: the rate starts at its peak and decays as it "
                             "does after warm-up (fairseq: --warmup-init-lr equal to --lr; the paper's warm-up "
                             "ablation, docs/results/fair-comparison.md)")
    parser.add_argument("--extend", action="store_true",
                        help="train the runs finished in --out that their budget ended on to the larger "
                             "--max-epoch/--max-update given after -- (the same flags otherwise), from "
                             "checkpoint_last.pt; their earlier results are kept in SAVE_DIR/before-extend/")
    return parser


def no_warmup_flags(datasets, passthrough) -> List[str]:
    """The fairseq-train flags of ``--no-warmup``: ``--warmup-init-lr`` at the peak learning rate
    (``-- --lr`` if given, else the datasets' config's), so that inverse_sqrt starts at the peak,
    stays there for the warm-up updates and then decays as it would have after warm-up."""
    for flag in ("--warmup-init-lr", "--lr-scheduler"):
        if flag_given(passthrough, flag):
            raise UserError(f"--no-warmup sets the warm-up itself: drop {flag} after --")
    peaks = {}
    for dataset in datasets:
        base = configs.read_yaml(configs.dataset_dir(dataset) / "base.yaml")
        scheduler = base.get("lr_scheduler", {}).get("_name")
        if scheduler != "inverse_sqrt":
            raise UserError(f"--no-warmup needs the inverse_sqrt learning-rate schedule; {dataset}'s config "
                            f"uses {scheduler}")
        peaks[dataset] = base["optimization"]["lr"][0]
    peak = flag_value(passthrough, "--lr")
    if peak is None:
        if len(set(peaks.values())) > 1:
            raise UserError("--no-warmup: the datasets' configs peak at different learning rates ("
                            + ", ".join(f"{name} {lr:g}" for name, lr in peaks.items())
                            + "): run them separately, or give one with -- --lr")
        peak = f"{next(iter(peaks.values())):g}"
    return ["--warmup-init-lr", peak]



def finished_runs(paths, out: Path) -> dict:
    """read_finished_runs of ``--finished-runs``, refusing this --out's own runs.json: the
    tables rewrite it, and records of runs outside this matrix would be gone from it."""
    for number, path in enumerate(paths):
        twice = next((earlier for earlier in paths[:number] if same_file(earlier, path)), None)
        if twice is not None:
            raise UserError(f"--finished-runs {path} is given twice (as {twice}): give each file once")
        if same_file(path, out / "runs.json"):
            raise UserError(f"--finished-runs {path} is this --out's runs.json, which this command rewrites: "
                            f"copy it elsewhere and give the copy")
    return read_finished_runs(paths)


def refuse_reports_over_inputs(out: Path, data: dict, finished_paths) -> None:
    """UserError when a table, record or plot this command writes into ``out`` would replace a file it
    reads: a file of a --data directory (or of residual-fairseq-prepare's output around it) or a
    --finished-runs file."""
    inputs = [("the --finished-runs file", path) for path in finished_paths]
    inputs += [entry for directory in data.values() if Path(directory).is_dir() for entry in data_input_files(directory)]
    for name in REPORT_NAMES:
        for role, path in inputs:
            if same_file(out / name, path):
                raise UserError(f"--out {out}: its {name} would overwrite {role} {path}: choose another --out")


def finished_runs_to_extend(runs: List[Run], passthrough, extend: bool) -> List[Run]:
    """The runs finished in this --out that ``--extend`` trains on to this command's larger budget
    (extend.trains_on). UserError when a run finished here was trained with other flags after -- than
    this command's (its run.json records them) and the difference is not a larger budget: its
    numbers would be tabulated as this matrix's."""
    extended, larger = [], 0
    for run in runs:
        recorded = recorded_extra_args(run.save_dir) if run.finished_here else None
        if recorded is None or recorded == list(passthrough):
            continue
        limits = larger_budget(recorded, passthrough, run)
        if limits is None:
            raise UserError(f"{run.label} finished in {run.save_dir} with other fairseq flags "
                            f"(-- {shlex.join(map(str, recorded)) or 'none'}) than this command's "
                            f"(-- {shlex.join(passthrough) or 'none'}): its numbers would be tabulated as this "
                            f"matrix's; give the same flags, or another --out")
        larger += 1
        if trains_on(run, *limits, extend):
            extended.append(run)
    if extend and not larger:
        print("note: --extend: no run finished in --out with a smaller budget than this command's", flush=True)
    return extended


def say_where_runs_come_from(runs: List[Run], finished_elsewhere: dict) -> None:
    """A note for records this matrix leaves out, and for runs finished both here and elsewhere."""
    keys = {(run.dataset, run.variant, run.layers, run.seed) for run in runs}
    outside = [key for key in finished_elsewhere if key not in keys]
    if outside:
        print(f"note: {len(outside)} finished runs of --finished-runs are outside this matrix "
              f"(--dataset/--variants/--layers/--seeds) and left out of its tables", flush=True)
    for run in runs:
        if run.record is not None and run.finished_here:
            print(f"note: {run.label} finished both here ({run.result_path}) and in {run.record_path}: "
                  f"tabulating this --out's", flush=True)


@cli_main
def main(argv=None):
    ours, passthrough = split_passthrough(argv)
    args = build_parser().parse_args(ours)
    check_output_dir(args.out, "--out")
    if args.extend and args.report_only:
        raise UserError("--extend trains runs on and --report-only trains nothing: give one of them")
    check_passthrough(passthrough)
    if args.no_warmup:
        passthrough = passthrough + no_warmup_flags(args.dataset, passthrough)
    check_evaluation_options(args.dataset, args.beam, args.generate_args)
    # A value given twice would be trained once and tabulated twice (two "seeds" of one run).
    for flag, values in (("--dataset", args.dataset), ("--variants", args.variants or ()),
                         ("--layers", args.layers or ()), ("--seeds", args.seeds or ())):
        refuse_repeats(values, flag)
    args.layers = args.layers or None
    args.seeds = args.seeds or [1]
    data = parse_data(args.data, args.dataset)
    elsewhere = finished_runs(args.finished_runs, Path(args.out))
    refuse_reports_over_inputs(Path(args.out), data, args.finished_runs)
    runs = matrix(data, Path(args.out), args.variants, args.layers, args.seeds, elsewhere)
    say_where_runs_come_from(runs, elsewhere)
    extended = [] if args.report_only else finished_runs_to_extend(runs, passthrough, args.extend)
    set_aside(extended, args.dry_run)
    # A dry run moves nothing: the runs it would extend are said so above, not "skip ... finished" below.
    shown = [run for run in runs if not (args.dry_run and run in extended)]
    print(f"{len(runs)} runs ({sum(run.finished for run in shown)} finished); extra fairseq flags: "
          f"{shlex.join(passthrough) or '-'}", flush=True)
    if args.report_only:
        paths = write_reports(runs, Path(args.out))
        print("wrote " + ", ".join(str(path) for path in paths.values()))
        return
    eval_overrides = {"generate_args": args.generate_args} if args.generate_args else {}
    if args.beam:
        eval_overrides["beam"] = args.beam
    reproduce(shown, Path(args.out), args.nprocs, passthrough, eval_overrides, args.dry_run, args.threads,
              jobs=args.jobs, verbose=args.verbose, report=not args.no_report)


if __name__ == "__main__":
    main()
