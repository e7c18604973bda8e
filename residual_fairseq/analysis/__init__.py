"""Diagnostics behind the ResiDual paper's argument, measured on real batches.

- Post-LN: the gradient norm shrinks toward the lower layers (gradient vanishing);
- Pre-LN: the upper layers' outputs become nearly identical (representation collapse);
- ResiDual: how large its dual stream grows (whether fp16 needs ``--dual-scale``).

Python API::

    from residual_fairseq.analysis import load_task, measurement_batches, fresh_model, measure
    task = load_task("data-bin/toy")
    batches = measurement_batches(task, "valid", max_tokens=2000, num_batches=2)
    criterion = build_label_smoothed_criterion(task)
    m = measure(fresh_model("post_ln", task, encoder_layers=24), criterion, batches)
    m.stacks["encoder"].param_grad_norm    # one number per layer, lowest first

The command line is :func:`main` (``residual-fairseq-analyze``).
"""
from .cli import main  # noqa: F401
from ..fairseq_data import load_task  # noqa: F401
from .data import measurement_batches, training_batches  # noqa: F401
from .models import fresh_model, load_checkpoint  # noqa: F401
from .probe import Measurement, StackMeasurement, StackProbe, measure  # noqa: F401
from .report import write_figures, write_tables  # noqa: F401
from .similarity import linear_cka, mean_token_cosine  # noqa: F401
from .training import Run, TrainingSettings, build_label_smoothed_criterion, train_and_measure  # noqa: F401
