"""Depth stability: narrow models of growing depth, trained for the same fixed budget.

Every variant at every depth starts from the same seed, sees the same batches in the
same order and follows the same learning-rate schedule (linear warm-up, then fairseq's
inverse square root decay), so the only difference left is the residual scheme. A run
counts as diverged if its loss becomes NaN/inf or ends no lower than it started.
"""
import math

import torch

from ..errors import UserError
from ..models.admin import profile_omegas
from ..variants import VARIANTS, needs_profile
from .data import draw_batches, load_task
from .training import Trainer, build_variant, check_precision, resolve_device, to_device


def inverse_sqrt_schedule(warmup_updates, warmup=True):
    """fairseq's ``inverse_sqrt`` as a multiplier of the peak lr: a linear warm-up from ~0 over
    ``warmup_updates``, then ``sqrt(warmup_updates / update)``. ``warmup=False`` is the paper's
    ablation as reproduce's --no-warmup runs it (fairseq: --warmup-init-lr equal to --lr): the
    peak from the first update to ``warmup_updates``, then the same decay."""
    if warmup_updates < 1:
        raise UserError("--warmup-updates must be at least 1 (inverse_sqrt divides by it); "
                        "for no warm-up give --no-warmup")

    def factor(update):
        update += 1
        if update < warmup_updates:
            return update / warmup_updates if warmup else 1.0
        return math.sqrt(warmup_updates / update)
    return factor


def train_one(task, variant, layers, width, train, valid, lr, warmup_updates, device,
              precision, seed, log_interval=0, progress=print, warmup=True) -> dict:
    torch.manual_seed(seed)
    model = build_variant(
        task, variant, "", encoder_layers=layers, decoder_layers=layers,
        encoder_embed_dim=width, decoder_embed_dim=width,
        encoder_ffn_embed_dim=4 * width, decoder_ffn_embed_dim=4 * width,
        encoder_attention_heads=4, decoder_attention_heads=4,
    ).to(device)
    if needs_profile(variant):  # Admin: omegas from a profiling pass on the first training batch
        profile_omegas(model, train[:1], seed=seed)
    trainer = Trainer(task, model, device, precision, lr=lr,
                      lr_schedule=inverse_sqrt_schedule(warmup_updates, warmup))
    losses = []
    for batch in train:
        losses.append(trainer.step(batch))
        if log_interval and len(losses) % log_interval == 0:
            # a run cut short (a time limit, a lost lease) still shows how far it got
            progress(f"seed {seed} L{layers} {variant}: update {len(losses)} loss {losses[-1]:.3f}")
        if not math.isfinite(losses[-1]):
            break
    tail = losses[-max(1, len(losses) // 10):]  # the last tenth smooths batch-to-batch noise
    final = sum(tail) / len(tail)
    valid_loss = trainer.loss(valid) if math.isfinite(final) else float("nan")
    diverged = not math.isfinite(final) or not math.isfinite(valid_loss) or final >= losses[0]
    return {"variant": variant, "layers": layers, "width": width, "updates": len(losses),
            "start_loss": losses[0], "final_loss": final, "valid_loss": valid_loss,
            "diverged": diverged}


def run_depth_benchmark(data, depths=(6, 12, 24), variants=VARIANTS, width=64, updates=300,
                        lr=1e-3, warmup_updates=100, max_tokens=2048, valid_batches=20,
                        device="auto", precision="fp32", threads=None, seed=1, seeds=None,
                        source_lang=None, target_lang=None, log_interval=0, progress=print,
                        warmup=True) -> dict:
    """Train every variant at every depth, for each seed (``seeds``, default ``[seed]``);
    returns settings and one row per run. A seed fixes the batches and every initialisation.
    ``log_interval``: also report the training loss every that many updates (0: only each run's end).
    ``warmup=False``: no learning-rate warm-up (see :func:`inverse_sqrt_schedule`)."""
    inverse_sqrt_schedule(warmup_updates, warmup)  # a warm-up it cannot follow fails before any run
    if updates < 1 or width < 4 or width % 4:
        raise UserError("--updates must be >= 1 and --width a positive multiple of 4 (4 heads)")
    seeds = list(seeds) if seeds else [seed]
    device = resolve_device(device)
    check_precision(precision, device)
    if threads:
        torch.set_num_threads(threads)
    task = load_task(data, source_lang, target_lang)
    valid = [to_device(b, device) for b in
             draw_batches(task, "valid", None, max_tokens=max_tokens, shuffle=False)[:valid_batches]]
    rows = []
    for run_seed in seeds:
        train = [to_device(b, device)
                 for b in draw_batches(task, "train", updates, max_tokens=max_tokens, seed=run_seed)]
        for layers in depths:
            for variant in variants:
                row = train_one(task, variant, layers, width, train, valid, lr, warmup_updates,
                                device, precision, run_seed, log_interval, progress, warmup)
                rows.append({**row, "seed": run_seed})
                progress(f"seed {run_seed} L{layers} {variant}: loss {row['start_loss']:.3f} -> "
                         f"{row['final_loss']:.3f}, valid {row['valid_loss']:.3f}"
                         f"{' DIVERGED' if row['diverged'] else ''}")
    settings = {"data": str(data), "depths": list(depths), "variants": list(variants),
                "width": width, "ffn": 4 * width, "heads": 4, "updates": updates, "lr": lr,
                "warmup_updates": warmup_updates, "warmup": warmup, "lr_scheduler": "inverse_sqrt",
                "max_tokens": max_tokens, "valid_batches": len(valid), "device": str(device),
                "precision": precision, "threads": torch.get_num_threads(), "seeds": seeds}
    return {"settings": settings, "rows": rows}


def summarize_seeds(rows) -> list:
    """One row per (layers, variant): valid loss mean and sample std over seeds, divergences counted."""
    groups = {}
    for row in rows:
        groups.setdefault((row["layers"], row["variant"]), []).append(row)
    summary = []
    for (layers, variant), runs in groups.items():
        losses = [run["valid_loss"] for run in runs]
        mean = sum(losses) / len(losses)
        std = math.sqrt(sum((x - mean) ** 2 for x in losses) / (len(losses) - 1)) if len(losses) > 1 else None
        summary.append({"layers": layers, "variant": variant, "seeds": len(runs), "valid_loss_mean": mean,
                        "valid_loss_std": std, "diverged": sum(run["diverged"] for run in runs)})
    return summary
