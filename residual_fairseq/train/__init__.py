"""Train one shipped config with fairseq-train: pick by dataset/variant/depth, print, run.

The command is plain ``fairseq-train`` with the config rendered as flags
(:func:`residual_fairseq.configs.fairseq_train_args`) and any extra fairseq flags
appended, so it can be copied and run by hand. fairseq itself resumes from
``SAVE_DIR/checkpoint_last.pt``. The driver copies fairseq's output (JSON log lines)
into ``SAVE_DIR/train.log`` (appending on resume; fairseq's own ``--log-file`` keeps
only some loggers, not the validation stats) and records the choice of config in
``SAVE_DIR/run.json`` (read back by fine-tuning and reproduce).

The parts, in the order a run uses them:

- :mod:`.plan`: the request, and the fairseq-train command(s) it runs (nothing is run);
- :mod:`.resume`: where fairseq resumes, the patience left, and the model it resumes as;
- :mod:`.run`: the save dir's checks, its lock and run.json, then the processes
  (supervised with :mod:`residual_fairseq.supervise`);
- :mod:`.progress`: fairseq's output, to train.log in full and to the console;
- :mod:`.cli`: the command line (:func:`main`).

Launch modes:

- one process: one GPU, or the CPU when CUDA is missing (fp16/amp are then turned off);
- ``--nprocs N`` with CUDA: fairseq's own launcher spawns N GPU workers;
- ``--nprocs N`` on CPU: N ranks started by hand with gloo and ``legacy_ddp`` (the
  only CPU multi-process setup that works with fairseq 0.12 here).
For multi-node GPU jobs run the printed command under your launcher (see docs/training.md).

CLI::

    residual-fairseq-train --dataset iwslt14-de-en --variant resi_dual --layers 12 \\
        --data data/iwslt14/bin --save-dir checkpoints/iwslt-resi_dual-12 -- --max-epoch 50
"""
# The names other modules and tests use as ``train.NAME``.
from ..passthrough import split_passthrough  # noqa: F401
from ..run_record import RUN_RECORD_NAME, read_run_record  # noqa: F401
from ..supervise import (  # noqa: F401
    LOCK_NAME, STOP_GRACE_SECONDS, die_with_the_driver, forwarding_stop_signals, kill_groups, save_dir_lock,
)
from .progress import LOG_NAME, ProgressDisplay  # noqa: F401
from .resume import refuse_resuming_another_model, resume_point, resumed_early_stopping  # noqa: F401
from .run import execute, refuse_links_in_save_dir, train, write_run_record  # noqa: F401
from .cli import build_parser, depths, main  # noqa: F401
# Last: ``train.plan`` is the function (importing the submodule plan.py set it to the module).
from .plan import (  # noqa: F401
    DRIVER_SET_FLAGS, RUN_IDENTITY_FLAGS, SIZE_FLAGS, TrainPlan, TrainRequest, check_extra_args, effective_model,
    plan, run_name,
)
