"""Run the paper's matrix (dataset x variant x depth x seed) and tabulate it.

Each run trains with :mod:`residual_fairseq.train` (which resumes an interrupted
run) and is then evaluated on the test set with
:func:`residual_fairseq.evaluate.evaluate_run`; a run whose ``result.json`` exists
is finished and skipped. :mod:`.report` then writes the
tables (mean +/- std over seeds, and every run seed by seed) and the validation
curves. ``--jobs N`` runs N at a time.

Layout::

    OUT/runs/<dataset>/<variant>-<L>l/seed<S>/   checkpoints, train.log, run.json, result.json
    OUT/results.md  OUT/results.csv  OUT/runs.md  OUT/runs.json  OUT/curves.png

CLI::

    residual-fairseq-reproduce --dataset sample-es-en --data data/sample/bin \\
        --variants post_ln resi_dual --seeds 1 2 --out results/sample

The package, by concept: :mod:`.runs` (the run model and the matrix), :mod:`.schedule`
(training and evaluating runs, one or several at a time), :mod:`.records` (a run's numbers
and runs.json records), :mod:`.report` (tables and curves), :mod:`.extend` (``--extend``: runs
their budget ended trained on to a larger one), :mod:`.cli`; :mod:`.best_lr`
(residual-fairseq-best-lr: each variant at its own best learning rate, over matrices run one
per rate) uses them and is imported by none.
"""
from ..errors import UserError
from .cli import build_parser, finished_runs, main, parse_data, say_where_runs_come_from
from .records import read_finished_runs, record_problem
from .report import write_reports
from .runs import (FAILURE_NAME, RESULT_NAME, Run, checkpoint_to_evaluate, evaluation_options,
                   language_model_evaluation_options, matrix, train_request)
from .schedule import (DRIVER_LOG_NAME, check_evaluation_options, check_passthrough, driver_command,
                       driver_environment, evaluate_language_model, reproduce, run_in_parallel, run_one,
                       threads_per_job)

__all__ = [
    "DRIVER_LOG_NAME", "FAILURE_NAME", "RESULT_NAME", "Run", "UserError", "build_parser", "check_evaluation_options",
    "check_passthrough", "checkpoint_to_evaluate", "driver_command", "driver_environment", "evaluate_language_model",
    "evaluation_options", "finished_runs", "language_model_evaluation_options", "main", "matrix", "parse_data",
    "read_finished_runs", "record_problem", "reproduce", "run_in_parallel", "run_one", "say_where_runs_come_from",
    "threads_per_job", "train_request", "write_reports",
]
