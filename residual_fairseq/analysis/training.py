"""A few hundred plain training updates, measured along the way.

The optimizer, the learning-rate schedule and the loss are fairseq's own
(``--optimizer adam``, ``--lr-scheduler inverse_sqrt``, the task's criterion); this
loop only replaces fairseq's Trainer bookkeeping (checkpoints, logging, fp16),
which a diagnostic run does not need.
"""
import argparse
import logging
import math
from dataclasses import dataclass, field
from typing import List, Optional

import torch
from fairseq import optim
from fairseq.optim import lr_scheduler

from .probe import Measurement, measure

logger = logging.getLogger(__name__)


@dataclass
class TrainingSettings:
    steps: int = 0                 # 0: measure at initialisation only
    measure_every: int = 100
    lr: float = 5e-4
    warmup_updates: int = 4000     # fairseq's transformer recipes use 4000
    adam_betas: str = "(0.9, 0.98)"
    clip_norm: float = 0.0         # fairseq-train's default: no clipping
    max_tokens: int = 4096


@dataclass
class Run:
    """One model's measurements: at step 0 and every ``measure_every`` updates."""

    label: str
    steps: List[int] = field(default_factory=list)
    measurements: List[Measurement] = field(default_factory=list)
    train_loss: List[float] = field(default_factory=list)   # per update, base 2
    diverged_at: Optional[int] = None


def build_label_smoothed_criterion(task, label_smoothing=0.1):
    return task.build_criterion(argparse.Namespace(
        criterion="label_smoothed_cross_entropy", label_smoothing=label_smoothing,
        sentence_avg=False, ignore_prefix_size=0, report_accuracy=False,
    ))


def build_optimizer(model, settings: TrainingSettings):
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = optim.build_optimizer(argparse.Namespace(
        optimizer="adam", lr=[settings.lr], adam_betas=settings.adam_betas, adam_eps=1e-8, weight_decay=0.0,
    ), params)
    scheduler = lr_scheduler.build_lr_scheduler(argparse.Namespace(
        lr_scheduler="inverse_sqrt", warmup_updates=settings.warmup_updates, warmup_init_lr=-1, lr=[settings.lr],
    ), optimizer)
    scheduler.step_update(0)
    return optimizer, scheduler


def train_and_measure(label, model, criterion, probe_batches, train_batches, settings: TrainingSettings) -> Run:
    """Measure ``model`` on ``probe_batches``, then train and re-measure periodically.

    Training stops early, keeping what was measured, if the loss turns non-finite.
    """
    run = Run(label=label)
    run.steps.append(0)
    run.measurements.append(measure(model, criterion, probe_batches))
    if settings.steps <= 0:
        return run
    optimizer, scheduler = build_optimizer(model, settings)
    model.train()
    for step in range(1, settings.steps + 1):
        sample = next(train_batches)
        optimizer.zero_grad()
        loss, sample_size, _ = criterion(model, sample)
        loss = loss / sample_size
        if not torch.isfinite(loss):
            run.diverged_at = step
            logger.warning(f"{label}: loss turned non-finite at update {step}; stopping its training")
            break
        loss.backward()
        if settings.clip_norm > 0:
            optimizer.clip_grad_norm(settings.clip_norm)
        optimizer.step()
        scheduler.step_update(step)
        run.train_loss.append(loss.item() / math.log(2))
        if step % settings.measure_every == 0 or step == settings.steps:
            run.steps.append(step)
            run.measurements.append(measure(model, criterion, probe_batches))
            logger.info(f"{label}: update {step}, train loss {run.train_loss[-1]:.3f}, "
                        f"measured loss {run.measurements[-1].loss:.3f}")
    model.eval()
    return run
