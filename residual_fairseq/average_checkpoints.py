"""Average the parameters of several fairseq checkpoints (fairseq's
``scripts/average_checkpoints.py``, which the fairseq wheels do not ship).

The averaged checkpoint is the newest input's full state (config, training state)
with every model tensor replaced by the element-wise mean over the inputs, so
fairseq-generate, fairseq-interactive and ``from_pretrained`` load it like any other.

Every input is read once and checked before it is unpickled
(:func:`residual_fairseq.checkpoints.read_checkpoint`: no code, no memory bombs,
a fairseq layout), and the inputs must agree in parameter names, shapes and dtypes,
and in architecture, task, language pair and the options that change what the model
computes (:data:`MODEL_DEFINING_OPTIONS`).

    residual-fairseq-average-checkpoints --inputs checkpoints/ --num-epoch-checkpoints 5 \\
        --output checkpoints/checkpoint.avg5.pt
"""
import argparse
import collections
import os
import re
import stat
from pathlib import Path
from typing import List, Optional, Sequence

import torch

from .argtypes import check_output_file, positive_int
from .atomic import atomic_output
from .errors import UserError, cli_main
from .runtime import add_verbose_flag
from .checkpoints import checkpoint_architecture, checkpoint_task, read_checkpoint

EPOCH_CHECKPOINT = re.compile(r"checkpoint(\d+)\.pt$")            # checkpoint12.pt
UPDATE_CHECKPOINT = re.compile(r"checkpoint_\d+_(\d+)\.pt$")      # checkpoint_3_5000.pt


def last_n_checkpoints(directory, n: int, update_based: bool = False, upper_bound: Optional[int] = None) -> List[str]:
    """The ``n`` newest epoch (or update) checkpoints in ``directory``, newest first.

    ``upper_bound`` ignores checkpoints after that epoch (or update number), as
    fairseq's ``--checkpoint-upper-bound`` does.
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise UserError(f"checkpoint directory not found: {directory}")
    pattern = UPDATE_CHECKPOINT if update_based else EPOCH_CHECKPOINT
    numbered = []
    for path in directory.iterdir():
        match = pattern.fullmatch(path.name)
        if match and (upper_bound is None or int(match.group(1)) <= upper_bound):
            numbered.append((int(match.group(1)), str(path)))
    if len(numbered) < n:
        kind = "update (checkpoint_E_U.pt)" if update_based else "epoch (checkpointN.pt)"
        raise UserError(f"found {len(numbered)} {kind} checkpoints in {directory}, need {n}")
    numbered.sort(reverse=True)
    return [path for _, path in numbered[:n]]


def load_checkpoint_file(path) -> dict:
    """One checkpoint file, on CPU: read once, checked, unpickled from the checked bytes
    (:func:`~residual_fairseq.checkpoints.read_checkpoint`)."""
    if os.path.isdir(path):
        raise UserError(f"{path} is a directory: give checkpoint files, or --num-epoch-checkpoints N")
    return read_checkpoint(path)


def check_same_model(params, reference, path, reference_path) -> None:
    """Raise :class:`UserError` unless ``params`` has exactly ``reference``'s names, shapes and dtypes."""
    if list(params) != list(reference):
        missing = sorted(set(reference) - set(params))[:3]
        extra = sorted(set(params) - set(reference))[:3]
        detail = ", ".join([f"missing {n}" for n in missing] + [f"extra {n}" for n in extra])
        raise UserError(f"{path} holds different parameters than {reference_path}: not the same model"
                        + (f" ({detail})" if detail else " (other order)"))
    for name, tensor in params.items():
        shape, dtype = reference[name]
        if tuple(tensor.shape) != shape or tensor.dtype != dtype:
            raise UserError(f"{path} and {reference_path} disagree on {name}: {tuple(tensor.shape)} {tensor.dtype} "
                            f"vs {shape} {dtype}: not the same model")


# Options that change what a model computes beyond its parameters' shapes (which
# check_same_model compares): inputs that differ in one are different models, and their
# average would be loaded as the first one's.
MODEL_DEFINING_OPTIONS = (
    "encoder_normalize_before", "decoder_normalize_before", "normalize_before",
    "dual_scale_encoder", "dual_scale_decoder", "main_alpha_encoder", "main_alpha_decoder",
    "activation_fn", "no_scale_embedding", "layernorm_embedding", "no_token_positional_embeddings",
    "encoder_learned_pos", "decoder_learned_pos", "share_all_embeddings", "share_decoder_input_output_embed",
    "cross_self_attention", "no_decoder_final_norm", "scale_attn", "scale_fc", "scale_heads", "scale_resids",
)


def model_definition(state) -> dict:
    """The architecture, task, language pair and :data:`MODEL_DEFINING_OPTIONS` of a checkpoint."""
    config = state["args"] if state.get("args") is not None else (state.get("cfg") or {}).get("model")
    flat = dict(vars(config)) if isinstance(config, argparse.Namespace) else dict(config or {})
    for stack in ("encoder", "decoder"):  # a hydra config nests them: encoder.normalize_before
        nested = flat.get(stack)
        nested = vars(nested) if isinstance(nested, argparse.Namespace) else nested
        if isinstance(nested, dict):
            flat.update({f"{stack}_{name}": value for name, value in nested.items() if f"{stack}_{name}" not in flat})
    task, source_lang, target_lang = checkpoint_task(state)
    return {"architecture": checkpoint_architecture(state), "task": task, "source language": source_lang,
            "target language": target_lang, **{name: flat.get(name) for name in MODEL_DEFINING_OPTIONS}}


def check_same_definition(definition, reference, path, reference_path) -> None:
    for name, value in definition.items():
        # An option one config lacks (written by an older fairseq or plugin) takes its default
        # when loaded: not a difference this check can see, so only stored values are compared.
        if value is not None and reference[name] is not None and value != reference[name]:
            raise UserError(f"{path} and {reference_path} are different models: {name} "
                            f"{str(value)[:40]} vs {str(reference[name])[:40]}")


def average_checkpoints(paths: Sequence[str]) -> dict:
    """The state of ``paths[0]`` with its model parameters averaged over all ``paths``.

    Every input must hold the same parameter names, shapes and dtypes. Sums are kept
    in float32 (half-precision inputs too) and cast back to each tensor's own dtype;
    integer buffers get the floor of the mean, as in fairseq.
    """
    if not paths:
        raise UserError("no checkpoints to average")
    new_state, sums, reference = None, collections.OrderedDict(), {}
    for path in paths:
        state = load_checkpoint_file(path)
        params = state["model"]
        if new_state is None:
            new_state = state
            reference = {name: (tuple(tensor.shape), tensor.dtype) for name, tensor in params.items()}
            reference_definition = model_definition(state)
        else:
            check_same_model(params, reference, path, paths[0])
            check_same_definition(model_definition(state), reference_definition, path, paths[0])
        for name, tensor in params.items():
            tensor = tensor.float() if tensor.is_floating_point() else tensor
            sums[name] = tensor.clone() if name not in sums else sums[name] + tensor
        del state, params
    averaged = collections.OrderedDict()
    for name, total in sums.items():
        mean = total / len(paths) if total.is_floating_point() else total // len(paths)
        averaged[name] = mean.to(reference[name][1])
    new_state["model"] = averaged
    return new_state


def save_checkpoint_atomically(state: dict, output) -> None:
    with atomic_output(output) as tmp:
        torch.save(state, tmp)


def average_last_checkpoints(
    directory, n: int, output, update_based: bool = False, upper_bound: Optional[int] = None
) -> List[str]:
    """Average the ``n`` newest checkpoints of ``directory`` into ``output``; returns their paths."""
    paths = last_n_checkpoints(directory, n, update_based, upper_bound)
    save_checkpoint_atomically(average_checkpoints(paths), output)
    return paths


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="residual-fairseq-average-checkpoints",
        description="Average the parameters of fairseq checkpoints (as fairseq's scripts/average_checkpoints.py).",
    )
    parser.add_argument("--inputs", required=True, nargs="+", action="extend",
                        help="checkpoint files, or one directory with --num-epoch-checkpoints/--num-update-checkpoints")
    parser.add_argument("--output", required=True, help="where to write the averaged checkpoint")
    count = parser.add_mutually_exclusive_group()
    count.add_argument("--num-epoch-checkpoints", type=positive_int,
                       help="average the last N epoch checkpoints (checkpointN.pt) of the --inputs directory")
    count.add_argument("--num-update-checkpoints", type=positive_int,
                       help="average the last N update checkpoints (checkpoint_E_U.pt) of the --inputs directory")
    parser.add_argument("--checkpoint-upper-bound", type=positive_int,
                        help="with --num-epoch/update-checkpoints: ignore checkpoints after this epoch / update number")
    add_verbose_flag(parser)
    return parser


def refuse_replacing_a_non_checkpoint(output: Path) -> None:
    """An existing --output is replaced only when it is a checkpoint (an earlier average):
    anything else there is a file of the user's that a typo would destroy."""
    try:
        if not output.exists():
            return
        if stat.S_ISREG(output.stat().st_mode):
            with open(output, "rb") as handle:
                if handle.read(4) == b"PK\x03\x04":  # a torch checkpoint's zip archive
                    return
    except OSError:
        pass
    raise UserError(f"--output {output} exists and is not a checkpoint: averaging would replace it; "
                    "choose another file")


@cli_main
def main(argv=None):
    args = build_parser().parse_args(argv)
    check_output_file(args.output, "--output")
    refuse_replacing_a_non_checkpoint(Path(args.output))
    n = args.num_epoch_checkpoints or args.num_update_checkpoints
    if n is None and args.checkpoint_upper_bound is not None:
        raise UserError("--checkpoint-upper-bound needs --num-epoch-checkpoints or --num-update-checkpoints")
    if n is not None:
        if len(args.inputs) != 1:
            raise UserError("with --num-epoch-checkpoints/--num-update-checkpoints, --inputs is one directory")
        paths = last_n_checkpoints(args.inputs[0], n, args.num_update_checkpoints is not None,
                                   args.checkpoint_upper_bound)
    else:
        paths = args.inputs
    if any(Path(path).resolve() == Path(args.output).resolve() for path in paths):
        raise UserError(f"--output {args.output} is one of the checkpoints being averaged: choose another file")
    print("averaging:\n  " + "\n  ".join(paths))
    save_checkpoint_atomically(average_checkpoints(paths), args.output)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
