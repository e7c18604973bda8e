"""Admin's first step for a training run: profile the omegas on real batches, write the file.

The model is built exactly as ``fairseq-train`` would build it from the same flags
(same seed, same task and data), its omegas are profiled on the first training
batch(es) of epoch 1 (:func:`residual_fairseq.models.admin.profile_omegas`), and
the profile is written as JSON; ``fairseq-train ... --admin-profile FILE`` then
initialises the model it trains from that file. ``residual-fairseq-train --variant
admin`` runs this before training (once per save dir).

CLI (for ``fairseq-hydra-train`` or hand-made ``fairseq-train`` runs)::

    python3 -m residual_fairseq.admin_profile OUT.json -- DATA --user-dir $(python3 -m residual_fairseq) \\
        --arch admin_iwslt_de_en --share-all-embeddings --max-tokens 4096 ...
"""
import argparse
import sys
from pathlib import Path

from .errors import UserError, cli_main

PROFILE_NAME = "admin_profile.json"


def profile_for_training(fairseq_train_args, out, batches: int = 1) -> Path:
    """Profile the model that ``fairseq-train FAIRSEQ_TRAIN_ARGS`` would train; write ``out``."""
    import torch
    from fairseq import options, tasks, utils
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    from .models import admin

    args = list(fairseq_train_args)
    if "--admin-profile" in args:
        raise UserError("profile without --admin-profile: the profile is what it writes")
    parser = options.get_training_parser()
    parsed = options.parse_args_and_arch(parser, args)
    if parsed.arch not in admin.ARCHITECTURES:
        raise UserError(f"--arch {parsed.arch} is not an Admin architecture ({', '.join(admin.ARCHITECTURES)})")
    cfg = convert_namespace_to_omegaconf(parsed)
    utils.set_torch_seed(cfg.common.seed)
    task = tasks.setup_task(cfg.task)
    model = task.build_model(cfg.model)  # fairseq's own init; omegas at 1
    use_cuda = torch.cuda.is_available() and not cfg.common.cpu
    if use_cuda:
        model = model.cuda()
    task.load_dataset(cfg.dataset.train_subset, epoch=1)
    iterator = task.get_batch_iterator(
        dataset=task.dataset(cfg.dataset.train_subset),
        max_tokens=cfg.dataset.max_tokens,
        max_sentences=cfg.dataset.batch_size,
        max_positions=utils.resolve_max_positions(task.max_positions(), model.max_positions(),
                                                  cfg.dataset.max_tokens),
        ignore_invalid_inputs=True,
        required_batch_size_multiple=cfg.dataset.required_batch_size_multiple,
        seed=cfg.common.seed,
        num_workers=0,
        epoch=1,
    ).next_epoch_itr(shuffle=True)
    samples = []
    for sample in iterator:
        samples.append(utils.move_to_cuda(sample) if use_cuda else sample)
        if len(samples) == batches:
            break
    if not samples:
        raise UserError(f"no training batches in {cfg.task.data} to profile Admin's omegas on")
    profile = admin.profile_omegas(model, samples, seed=cfg.common.seed)
    details = {"arch": parsed.arch, "seed": cfg.common.seed, "batches": len(samples),
               "sentences": sum(int(sample["nsentences"]) for sample in samples),
               "encoder_layers": len(profile["encoder"]), "decoder_layers": len(profile["decoder"])}
    return admin.write_profile(profile, out, details)


def build_parser():
    parser = argparse.ArgumentParser(
        prog="python3 -m residual_fairseq.admin_profile",
        description="Profile Admin's omegas for the model fairseq-train would train with the flags after --, "
                    "and write them as JSON (pass it back with --admin-profile / model.admin_profile).",
    )
    parser.add_argument("out", help="profile file to write (JSON)")
    parser.add_argument("--batches", type=int, default=1, help="training batches to profile on (default 1)")
    return parser


@cli_main
def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        raise UserError("give the fairseq-train flags after --")
    split = argv.index("--")
    args = build_parser().parse_args(argv[:split])
    if args.batches < 1:
        raise UserError(f"--batches must be at least 1, got {args.batches}")
    path = profile_for_training(argv[split + 1:], args.out, args.batches)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
