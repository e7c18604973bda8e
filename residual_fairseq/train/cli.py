"""The ``residual-fairseq-train`` command line: its flags, the depths, and main."""
import argparse
from pathlib import Path

from .. import configs
from ..argtypes import MAX_SEED, int_at_least, positive_int
from ..errors import UserError, cli_main
from ..passthrough import split_passthrough
from ..runtime import add_threads_flag, add_verbose_flag
from ..variants import VARIANTS
from .plan import TrainRequest
from .run import train


def build_parser():
    parser = argparse.ArgumentParser(
        prog="residual-fairseq-train",
        description="Train a shipped config with fairseq-train. Flags after -- go to fairseq-train unchanged.",
        epilog="example: residual-fairseq-train --dataset sample-es-en --variant resi_dual --layers 3 "
               "--data data/sample/bin --save-dir checkpoints/sample -- --max-epoch 1",
    )
    parser.add_argument("--dataset", required=True, choices=list(configs.DATASETS), help="config family")
    parser.add_argument("--variant", required=True, choices=VARIANTS, help="residual scheme")
    depth = int_at_least(1, configs.MAX_LAYERS)
    parser.add_argument("--layers", type=depth,
                        help="encoder and decoder depth: any depth, the dataset's base.yaml gives the rest "
                             "(its shipped depths are the per-run yaml files)")
    parser.add_argument("--encoder-layers", type=depth,
                        help="encoder depth (default: --layers; refused for a language model, which has none)")
    parser.add_argument("--decoder-layers", type=depth,
                        help="decoder depth (default: --layers; a language model's depth, alone)")
    parser.add_argument("--data", required=True, help="fairseq data directory (the prepared bin/)")
    parser.add_argument("--source-lang", "-s", help="source language (default: the config's pair if the data "
                                                     "hold it, else the data's pair)")
    parser.add_argument("--target-lang", "-t", help="target language")
    parser.add_argument("--save-dir", required=True, help="checkpoints, train.log and run.json go here")
    parser.add_argument("--seed", type=int_at_least(0, MAX_SEED), help="override the config's seed")
    parser.add_argument("--nprocs", type=positive_int, default=1,
                        help="processes: GPUs (fairseq spawns them) or, without CUDA, CPU ranks over gloo")
    parser.add_argument("--cpu", action="store_true", default=None,
                        help="train on CPU even when CUDA is available (default: CPU only without CUDA)")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                        help="progress bar instead of log lines on the console (default: on a terminal)")
    add_threads_flag(parser)
    add_verbose_flag(parser)
    parser.add_argument("--dry-run", action="store_true", help="print the fairseq command(s) and exit")
    return parser


def depths(args, parser):
    """(encoder layers, decoder layers) from --layers / --encoder-layers / --decoder-layers.

    A language model has a decoder only: its depth is --layers or --decoder-layers
    (both: the same number), and --encoder-layers is refused; it comes back as
    (depth, None).
    """
    if configs.DATASETS[args.dataset].task == "language_modeling":
        if args.encoder_layers is not None:
            raise UserError(f"--encoder-layers: {args.dataset} trains a language model, which has no encoder; "
                            "give its depth with --layers or --decoder-layers")
        if None not in (args.layers, args.decoder_layers) and args.layers != args.decoder_layers:
            raise UserError(f"--layers {args.layers} and --decoder-layers {args.decoder_layers}: a language model "
                            "has one stack, give its depth once")
        depth = args.decoder_layers or args.layers
        if depth is None:
            raise UserError("give --layers N (or --decoder-layers N): the language model's depth")
        return depth, None
    encoder = args.encoder_layers or args.layers
    decoder = args.decoder_layers or args.layers
    if encoder is None or decoder is None:
        parser.error("give --layers N (or both --encoder-layers and --decoder-layers)")
    return encoder, decoder


@cli_main
def main(argv=None):
    ours, passthrough = split_passthrough(argv)
    parser = build_parser()
    args = parser.parse_args(ours)
    encoder_layers, decoder_layers = depths(args, parser)
    request = TrainRequest(args.dataset, args.variant, encoder_layers, Path(args.data), Path(args.save_dir),
                           seed=args.seed, nprocs=args.nprocs, cpu=args.cpu, extra_args=passthrough,
                           source_lang=args.source_lang, target_lang=args.target_lang,
                           decoder_layers=decoder_layers, threads=args.threads, progress=args.progress)
    train(request, dry_run=args.dry_run)

