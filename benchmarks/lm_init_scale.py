"""A ResiDual language model's output scale against the baselines': why a fresh one starts at a higher loss, and whether a trained one's scale still costs anything.

ResiDual's decoder output is ``y = x_N + LN_final(d_N)``: the sum of two unit-scale terms
(``x_N`` leaves a LayerNorm, and so does ``LN_final(d_N)``), so at initialisation its
per-token RMS is between sqrt(2) (the two terms independent) and 2 (aligned) times Pre-LN's
``LN_final(x_N)``. With tied input/output
embeddings the logits are ``y @ E^T``, so their spread grows with ``y``'s RMS, and a
fresh model's loss (which is lowest for flat logits) grows with it.

For each variant, depth and seed this measures, on real validation blocks of sample-lm
(the sizes of configs/sample-lm: 64/256/4, tied embeddings, eval mode):

- ``rms``: the per-token RMS of the decoder's output features (before the projection);
- ``logit_std``: the standard deviation of the logits over the vocabulary, per token, averaged;
- ``loss``: the model's cross entropy in bits/token at initialisation;
- ``loss_unit_rms``: the same model with its output features divided by their RMS (every
  variant then feeds unit-RMS features to the same tied projection): if ResiDual's extra
  initial loss is its output scale, this column is the same for every variant.

    PYTHONPATH=<checkout> python3 benchmarks/lm_init_scale.py DATA/sample-lm/bin [--seeds 1 2 3] [--layers 6 24]

With ``--trained LABEL=CHECKPOINT ...`` it measures trained language models instead, on every
validation block, and asks whether their output scale still costs anything: ``best_scale`` is
the one factor on the logits (a temperature; the logits are linear in the output features) that
minimises the validation loss, and ``loss_best_scale`` the loss there. A model whose scale is
right has ``best_scale`` ~1 and gains nothing from it; if a gap between variants is their
scale, it closes at each one's best scale.

    PYTHONPATH=<checkout> python3 benchmarks/lm_init_scale.py DATA/sample-lm/bin \\
        --trained pre_ln=RUNS/pre_ln-6l/seed1/checkpoint_best.pt resi_dual=RUNS/resi_dual-6l/seed1/checkpoint_best.pt
"""
import argparse
import math
import statistics

import torch
import torch.nn.functional as F
from scipy.optimize import minimize_scalar

from fairseq.data import Dictionary, data_utils

from residual_fairseq.errors import UserError, cli_main
from residual_fairseq.variants import LM_VARIANTS, build_language_model

SIZES = dict(decoder_embed_dim=64, decoder_input_dim=64, decoder_output_dim=64, decoder_ffn_embed_dim=256,
             decoder_attention_heads=4, share_decoder_input_output_embed=True, dropout=0.1,
             tokens_per_sample=128)


def validation_blocks(data_bin, block: int = 128, count: int = 32):
    """The first ``count`` (``None``: all) blocks of ``block + 1`` tokens of the validation stream."""
    dictionary = Dictionary.load(f"{data_bin}/dict.txt")
    dataset = data_utils.load_indexed_dataset(f"{data_bin}/valid", dictionary)
    if dataset is None:
        raise UserError(f"{data_bin} holds no binarized validation split (valid.bin/.idx): pass a prepared bin/")
    stream = torch.cat([dataset[i] for i in range(len(dataset))])
    usable = (len(stream) - 1) // block
    if usable < 1:
        raise UserError(f"{data_bin}/valid holds {len(stream)} tokens: fewer than one block of {block + 1}")
    count = usable if count is None else min(count, usable)
    blocks = torch.stack([stream[i * block:(i + 1) * block + 1] for i in range(count)])
    return dictionary, blocks


@torch.no_grad()
def measure(model, blocks, fit_scale: bool = False) -> dict:
    """The quantities of the module's docstring; with ``fit_scale``, also the best logit scale
    and the loss there (:func:`best_scale`), from the same forward pass."""
    model.eval()
    tokens, targets = blocks[:, :-1], blocks[:, 1:]
    features, _ = model.decoder.extract_features(tokens, None)
    rms = features.pow(2).mean(-1).sqrt()
    logits = model.decoder.output_layer(features)
    unit = model.decoder.output_layer(features / rms.unsqueeze(-1))
    nats = F.cross_entropy(logits.transpose(1, 2).float(), targets)
    nats_unit = F.cross_entropy(unit.transpose(1, 2).float(), targets)
    row = {"rms": rms.mean().item(), "logit_std": logits.float().std(-1).mean().item(),
           "loss": nats.item() / math.log(2), "loss_unit_rms": nats_unit.item() / math.log(2)}
    if fit_scale:
        row["best_scale"], row["loss_best_scale"] = best_scale(logits, targets)
    return row


def best_scale(logits, targets) -> tuple:
    """The factor ``c`` on the logits that minimises their cross entropy, and that loss in bits.

    The loss is convex in ``c`` (a log-sum-exp of terms linear in ``c``, minus one linear
    term), so a bounded one-dimensional search finds its minimum."""
    logits, targets = logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1)

    def bits(c):
        return F.cross_entropy(c * logits, targets).item() / math.log(2)

    found = minimize_scalar(bits, bounds=(0.05, 20.0), method="bounded", options={"xatol": 1e-4})
    return float(found.x), float(found.fun)


def checkpoint_spec(text: str) -> tuple:
    """``LABEL=CHECKPOINT`` of ``--trained``."""
    label, sep, path = text.partition("=")
    if not sep or not label or not path:
        raise argparse.ArgumentTypeError(f"expected LABEL=CHECKPOINT, got {text!r}")
    return label, path


def trained_table(data_bin, specs) -> None:
    from residual_fairseq import load_language_model

    dictionary, blocks = validation_blocks(data_bin, count=None)
    # every checkpoint read and checked before the table starts (the loader refuses one whose
    # dictionary is not data_bin's)
    models = [(label, load_language_model(path, data=data_bin, cpu=True).hub.models[0]) for label, path in specs]
    print(f"{len(blocks)} validation blocks of {blocks.shape[1] - 1} tokens (all of them); vocabulary {len(dictionary)}")
    print("| model | output RMS | logit std | valid loss (bits) | best logit scale | loss at the best scale (bits) |")
    print("|---|---|---|---|---|---|")
    for label, model in models:
        row = measure(model, blocks, fit_scale=True)
        print(f"| {label} | {row['rms']:.3f} | {row['logit_std']:.3f} | {row['loss']:.4f} | "
              f"{row['best_scale']:.3f} | {row['loss_best_scale']:.4f} |")


@cli_main
def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data_bin")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--layers", type=int, nargs="+", default=[6, 24])
    parser.add_argument("--trained", type=checkpoint_spec, nargs="+", metavar="LABEL=CHECKPOINT",
                        help="measure these trained language models instead of fresh ones")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.trained:
        return trained_table(args.data_bin, args.trained)
    dictionary, blocks = validation_blocks(args.data_bin)
    print(f"{len(blocks)} validation blocks of {blocks.shape[1] - 1} tokens; vocabulary {len(dictionary)} "
          f"(uniform: {math.log2(len(dictionary)):.2f} bits)")
    print("| variant | layers | output RMS | logit std | loss at init (bits) | loss, features at unit RMS (bits) |")
    print("|---|---|---|---|---|---|")
    for layers in args.layers:
        for variant in LM_VARIANTS:
            rows = []
            for seed in args.seeds:
                torch.manual_seed(seed)
                model = build_language_model(variant, dictionary, decoder_layers=layers, **SIZES)
                rows.append(measure(model, blocks))
            cells = []
            for key in ("rms", "logit_std", "loss", "loss_unit_rms"):
                values = [row[key] for row in rows]
                spread = statistics.stdev(values) if len(values) > 1 else 0.0
                cells.append(f"{statistics.mean(values):.3f} ± {spread:.3f}")
            print(f"| {variant} | {layers} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
