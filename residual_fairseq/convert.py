"""Turn a checkpoint of the paper's authors' fairseq implementation into a ``resi_dual`` one.

Their code (microsoft/ResiDual, a fairseq 0.12 user dir) registers a model named
``resi_dual`` too, with a config dataclass: fairseq stores its options as a plain dict
(``cfg["model"]``, ``args`` None) with nested ``encoder``/``decoder`` dicts, fairseq's
parameter names throughout, and four extra options:

    enc_res_input_norm_scale, dec_res_input_norm_scale   ->  dual_scale_encoder, dual_scale_decoder
    enc_alpha, dec_alpha                                 ->  main_alpha_encoder, main_alpha_decoder
    encoder.layer_norm.{weight,bias}  (LN_final of d)    ->  the same names here
    encoder/decoder normalize_before (true in their yamls; their layers never read it)  ->  dropped, said on stderr

So the weights carry over as they are; the stored config gets the project's option
names and a ``resi_dual*`` architecture (``transformer_X`` becomes ``resi_dual_X``;
the sizes stored in the config are kept either way). The result is checked by
building the model and loading the weights strictly before anything is written,
and is written atomically, never over an existing file. At s != 1 the converted model
differs from theirs by up to ~3e-6 in log-probs: LN_final's eps is 1e-7 * s^2 here,
1e-7 there (docs/conversion.md).

    residual-fairseq-convert authors_checkpoint.pt resi_dual_checkpoint.pt
"""
import argparse
import sys
from argparse import Namespace
from pathlib import Path

import torch
from omegaconf import OmegaConf

from .argtypes import is_finite_number
from .average_checkpoints import load_checkpoint_file, save_checkpoint_atomically
from .errors import UserError, cli_main
from .models.resi_dual import FAIRSEQ_PRESET_OF, OFFICIAL_OPTION_NAMES
from .checkpoints import config_option, config_shapes, drop_config_option, set_config_option

RESI_DUAL_OF_PRESET = {preset: arch for arch, preset in FAIRSEQ_PRESET_OF.items()}


def _options(state: dict):
    """The stored model options: ``args`` (older fairseq) or ``cfg["model"]``, a
    Namespace for models registered the legacy way, else a dict."""
    if not isinstance(state, dict) or not isinstance(state.get("model"), dict):
        raise UserError("not a fairseq checkpoint: no 'model' weights")
    if state.get("args") is not None:
        options = state["args"]
    elif isinstance(state.get("cfg"), dict):
        options = state["cfg"].get("model")
    else:
        raise UserError("the checkpoint holds neither 'args' nor a 'cfg': not a fairseq checkpoint")
    if not isinstance(options, (Namespace, dict)):
        raise UserError(f"the checkpoint's model options are a {type(options).__name__}, not a Namespace or dict")
    return options


def resi_dual_arch(stored_arch) -> str:
    if stored_arch in FAIRSEQ_PRESET_OF:
        return stored_arch
    return RESI_DUAL_OF_PRESET.get(stored_arch, "resi_dual")


def _drop_authors_normalize_before(options, authors: bool) -> list:
    """``encoder``/``decoder`` ``normalize_before`` (nested, as the authors' config dataclass
    stores it, or flat): the authors' yamls set it true and their layers never read it, so in
    their checkpoint it is dropped; in any other it means a Pre-LN model, refused.
    Returns the names dropped."""
    dropped = []
    for side in ("encoder", "decoder"):
        nested = config_option(options, side)
        for config, name, shown in ((nested, "normalize_before", f"{side}.normalize_before"),
                                    (options, f"{side}_normalize_before", f"{side}_normalize_before")):
            if not isinstance(config, (dict, Namespace)) or not config_option(config, name):
                continue
            if not authors:
                raise UserError(f"the checkpoint's {side} is Pre-LN ({shown}): not a ResiDual model")
            drop_config_option(config, name)
            dropped.append(shown)
    return dropped


def convert_state(state: dict, arch=None, notes=None) -> dict:
    """The converted checkpoint state (``state`` is changed in place and returned).

    What was dropped is appended to ``notes``, one line each."""
    notes = [] if notes is None else notes
    options = _options(state)
    # The authors' config dataclass stores all four of their options.
    authors = any(config_option(options, official) is not None for official in OFFICIAL_OPTION_NAMES)
    stored_arch = config_option(options, "_name") or config_option(options, "arch")
    new_arch = arch or resi_dual_arch(stored_arch)
    if new_arch not in FAIRSEQ_PRESET_OF:
        raise UserError(f"--arch must be one of {', '.join(sorted(FAIRSEQ_PRESET_OF))}, got {new_arch!r}")
    for official, ours in OFFICIAL_OPTION_NAMES.items():
        value = config_option(options, official)
        if value is not None:
            current = config_option(options, ours)
            if current is not None and current != value:
                raise UserError(f"the checkpoint sets both {official}={value} and {ours}={current}")
            if not is_finite_number(value):
                raise UserError(f"the checkpoint's {official} is {str(value)[:40]!r}, not a finite number")
            set_config_option(options, ours, float(value))
        drop_config_option(options, official)
    dropped = _drop_authors_normalize_before(options, authors)
    if dropped:
        notes.append(f"note: dropped {' and '.join(dropped)} = true: the authors' ResiDual layers never read it "
             "(their yamls set it); resi_dual's main stream is Post-LN, as theirs")
    set_config_option(options, "_name", new_arch)
    if config_option(options, "arch") is not None or isinstance(options, Namespace):
        set_config_option(options, "arch", new_arch)
    # Release 0.1 of this project kept LN_final one module deeper.
    model = state["model"]
    for key in [k for k in model if ".layer_norm.norm." in k]:
        model[key.replace(".layer_norm.norm.", ".layer_norm.", 1)] = model.pop(key)
    return state


def check_loads(state: dict, source="the checkpoint") -> None:
    """Build the converted model (shapes only) and check that its weights fit it exactly."""
    options = _options(state)
    weights = state["model"]
    if not all(f"{side}.embed_tokens.weight" in weights for side in ("encoder", "decoder")):
        raise UserError("the checkpoint has no encoder/decoder embeddings: not a fairseq translation model")
    cfg = options if isinstance(options, Namespace) else OmegaConf.create(options)
    try:
        expected, _ = config_shapes(cfg, weights, source)
    except UserError:
        raise
    except Exception as err:  # noqa: BLE001  (fairseq's errors, made one line)
        raise UserError(f"the converted checkpoint does not build a resi_dual model: {err}".splitlines()[0])
    missing = sorted(set(expected) - set(weights))
    unexpected = sorted(set(weights) - set(expected))
    wrong_shape = sorted(n for n in set(expected) & set(weights)
                         if not isinstance(weights[n], torch.Tensor) or tuple(weights[n].shape) != expected[n])
    if missing or unexpected or wrong_shape:
        raise UserError(
            "the checkpoint's weights do not fit a resi_dual model"
            + (f"; missing: {', '.join(missing[:5])}" if missing else "")
            + (f"; unexpected: {', '.join(unexpected[:5])}" if unexpected else "")
            + (f"; wrong shape: {', '.join(wrong_shape[:5])}" if wrong_shape else "")
        )


def convert_checkpoint(source, output, arch=None) -> dict:
    source, output = Path(source), Path(output)
    if output.exists():
        raise UserError(f"{output} exists: choose a new output file (nothing is overwritten)")
    if output.resolve().parent.exists() and not output.resolve().parent.is_dir():
        raise UserError(f"cannot write {output}: its parent is not a directory")
    notes = []
    state = convert_state(load_checkpoint_file(source), arch, notes)
    check_loads(state, source)
    save_checkpoint_atomically(state, output)
    for note in notes:
        print(note, file=sys.stderr)
    return state


def build_parser():
    parser = argparse.ArgumentParser(
        prog="residual-fairseq-convert",
        description="Convert a checkpoint of the ResiDual authors' fairseq implementation "
        "(their option names) into a resi_dual checkpoint of this plugin.",
    )
    parser.add_argument("source", help="the authors'-layout checkpoint (.pt)")
    parser.add_argument("output", help="where to write the resi_dual checkpoint (must not exist)")
    parser.add_argument("--arch", help="resi_dual architecture to record (default: resi_dual_X for a "
                        "stored transformer_X, else resi_dual; sizes come from the stored config)")
    return parser


@cli_main
def main(argv=None):
    args = build_parser().parse_args(argv)
    if Path(args.source).is_dir():  # (the loader's own message names average-checkpoints' options)
        raise UserError(f"{args.source} is a directory: convert takes one checkpoint file, "
                        f"e.g. {Path(args.source) / 'checkpoint_best.pt'}")
    state = convert_checkpoint(args.source, args.output, args.arch)
    options = _options(state)
    print(f"wrote {args.output}: arch {config_option(options, 'arch') or config_option(options, '_name')}, "
          + ", ".join(f"{name}={config_option(options, name)}" for name in OFFICIAL_OPTION_NAMES.values()))


if __name__ == "__main__":
    main()
