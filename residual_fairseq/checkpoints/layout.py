"""The layout of a fairseq checkpoint, checked on the unpickled state (check 4).

A dict with known entries, ``model`` a dict of tensors, ``args`` an
``argparse.Namespace`` or ``cfg`` a dict, plain values only, no omegaconf ``${...}``
interpolations; subword-encoder options name no URL and no device; the string options
that fairseq evaluates parse as literals (:mod:`.config_strings`); the architecture is
registered; and the values have the types fairseq's config dataclasses declare (:mod:`.types`). Also the readers of a verified state's architecture and task.
"""
import argparse
import os
import stat

import torch

from .config_strings import CodeInConfigError, check_config_strings
from .errors import CheckpointError
from .options import config_option
from .types import check_config_types

# Checkpoint entries fairseq writes (trainer.state_dict) or upgrades from old formats.
FAIRSEQ_ENTRIES = frozenset({
    "args", "cfg", "model", "criterion", "optimizer_history", "task_state", "extra_state",
    "last_optimizer_state", "ema", "fsdp_metadata",
    "optimizer", "best_loss", "epoch", "batch_offset", "val_loss",  # fairseq < 0.6, upgraded on load
})
MAX_CONFIG_NODES = 100_000
MAX_CONFIG_DEPTH = 32  # fairseq nests configs 3-4 deep; omegaconf recurses once per level

# Options of fairseq's subword encoders (--bpe) that name a file or URL to open. A checkpoint
# may name a file (fairseq-train stores the path it was given), but not a pipe or device,
# which would block or never end, nor a URL to download other than fairseq's own defaults.
ENCODER_FILE_OPTIONS = ("sentencepiece_model", "sentencepiece_model_path", "bpe_codes", "gpt2_encoder_json",
                        "gpt2_vocab_bpe", "bpe_vocab_file", "bpe_merges", "bpe_vocab")
FAIRSEQ_DEFAULT_URLS = {"https://dl.fbaipublicfiles.com/fairseq/gpt2_bpe/encoder.json",
                        "https://dl.fbaipublicfiles.com/fairseq/gpt2_bpe/vocab.bpe"}


def check_named_files(state, path) -> None:
    """Refuse a checkpoint whose subword-encoder options name a URL or a file that is not a
    regular file (see :data:`ENCODER_FILE_OPTIONS`)."""
    cfg = state.get("cfg") if isinstance(state.get("cfg"), dict) else {}
    sources = [("args", state.get("args"))] + [(f"cfg.{section}", cfg.get(section)) for section in ("bpe", "tokenizer")]
    for where, config in sources:
        for name in ENCODER_FILE_OPTIONS:
            value = config_option(config, name)
            if not isinstance(value, str) or value in ("", "???") or value in FAIRSEQ_DEFAULT_URLS:
                continue
            if "://" in value:
                raise CheckpointError(f"refusing to load checkpoint {path}: {where}.{name} names a URL "
                                      f"({value[:60]!r}), which loading it would download")
            try:
                mode = os.stat(value).st_mode
            except (OSError, ValueError):
                continue  # no such file here: fairseq says so if it needs it (the hub uses its own copy)
            if not stat.S_ISREG(mode):
                raise CheckpointError(f"refusing to load checkpoint {path}: {where}.{name} names {value[:60]!r}, "
                                      "which is not a regular file")



def check_plain_config(config, where, path, leaves_checked=True):
    """Config values are plain data: no tensors, no objects, no omegaconf interpolations
    (``leaves_checked=False``, for extra_state: only its size and depth are bounded)."""
    stack, seen = [(config, where, 0)], 0
    while stack:
        node, at, depth = stack.pop()
        seen += 1
        if seen > MAX_CONFIG_NODES:
            raise CheckpointError(f"checkpoint {path} is malformed: {where} has more than {MAX_CONFIG_NODES} values")
        if depth > MAX_CONFIG_DEPTH:
            raise CheckpointError(f"checkpoint {path} is malformed: {where} is nested more than "
                                  f"{MAX_CONFIG_DEPTH} levels deep")
        if isinstance(node, argparse.Namespace):
            node = vars(node)
        if isinstance(node, dict):
            for key, value in node.items():
                if not isinstance(key, (str, int)):
                    raise CheckpointError(f"checkpoint {path} is malformed: {at} has a key of type {type(key).__name__}")
                stack.append((value, f"{at}.{key}", depth + 1))
        elif isinstance(node, (list, tuple)):
            stack.extend((value, f"{at}[{i}]", depth + 1) for i, value in enumerate(node))
        elif not leaves_checked:
            continue
        elif isinstance(node, str):
            if "${" in node:
                raise CheckpointError(f"refusing to load checkpoint {path}: {at} is an omegaconf interpolation "
                                      f"({node[:60]!r}); fairseq saves resolved values")
        elif node is not None and not isinstance(node, (bool, int, float)):
            raise CheckpointError(f"checkpoint {path} is malformed: {at} is a {type(node).__name__}, "
                                  "not a config value")


def check_fairseq_layout(state, path) -> None:
    """Raise :class:`CheckpointError` unless ``state`` has the layout of a fairseq checkpoint."""
    malformed = f"checkpoint {path} is not a fairseq checkpoint"
    if not isinstance(state, dict):
        raise CheckpointError(f"{malformed}: it holds a {type(state).__name__}, not a dict")
    unexpected = sorted(str(key)[:40] for key in state if key not in FAIRSEQ_ENTRIES)
    if unexpected:
        raise CheckpointError(f"{malformed}: unexpected entries {', '.join(unexpected[:5])}")
    model = state.get("model")
    if model is None:
        raise CheckpointError(f"{malformed}: no 'model' entry")
    if not isinstance(model, dict) or not model:
        what = "an empty dict" if isinstance(model, dict) else f"a {type(model).__name__}"
        raise CheckpointError(f"{malformed}: 'model' is {what}, not a dict of tensors")
    if not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in model.items()):
        raise CheckpointError(f"{malformed}: 'model' holds something other than named tensors")
    args, cfg = state.get("args"), state.get("cfg")
    if args is not None and not isinstance(args, argparse.Namespace):
        raise CheckpointError(f"{malformed}: 'args' is a {type(args).__name__}, not an argparse.Namespace")
    if cfg is not None and not isinstance(cfg, dict):
        raise CheckpointError(f"{malformed}: 'cfg' is a {type(cfg).__name__}, not a dict")
    if args is None and cfg is None:
        raise CheckpointError(f"{malformed}: neither 'args' nor 'cfg' (the training config)")
    config = args if args is not None else cfg
    if args is None:
        for section, value in cfg.items():
            if value is not None and not isinstance(value, (dict, argparse.Namespace)) and section != "_name":
                raise CheckpointError(f"{malformed}: cfg.{section} is a {type(value).__name__}")
        if not isinstance(cfg.get("model"), (dict, argparse.Namespace)):
            raise CheckpointError(f"{malformed}: no cfg.model (the model's config)")
    elif not isinstance(getattr(args, "arch", None), str) or not isinstance(getattr(args, "task", None), str):
        raise CheckpointError(f"{malformed}: 'args' names no arch and task")
    history = state.get("optimizer_history")
    if history is None and not {"optimizer", "best_loss"} <= state.keys():
        raise CheckpointError(f"{malformed}: no 'optimizer_history'")
    if history is not None and not (isinstance(history, list) and history
                                    and all(isinstance(h, dict) for h in history)):
        raise CheckpointError(f"{malformed}: 'optimizer_history' is not a list of dicts")
    for name, value in (("args", args), ("cfg", cfg)):
        if value is not None:
            check_plain_config(value, name, path)
    if state.get("extra_state") is not None:  # (holds tensors: fairseq's metrics)
        check_plain_config(state["extra_state"], "extra_state", path, leaves_checked=False)
    check_named_files(state, path)
    # Translation models and language models always store their token embeddings; without them
    # the config's sizes could not be checked against the weights (check_config_fits_weights),
    # and fairseq would build whatever the config asks (an FFN of 10^8 units) before comparing.
    task, _, _ = checkpoint_task(state)
    if task in ("translation", "language_modeling") and "fsdp_metadata" not in state \
            and not isinstance(model.get("decoder.embed_tokens.weight"), torch.Tensor):
        raise CheckpointError(f"{malformed}: it holds no decoder.embed_tokens.weight (a translation or language "
                              "model always stores its token embeddings)")
    try:
        check_config_strings(config, "args" if args is not None else "cfg")
    except CodeInConfigError as err:
        raise CheckpointError(f"refusing to load checkpoint {path}: {err}") from None
    arch = checkpoint_architecture(state)
    from fairseq.models import ARCH_MODEL_REGISTRY

    if arch is not None and not isinstance(arch, str):
        raise CheckpointError(f"{malformed}: its architecture is a {type(arch).__name__}")
    if arch is not None and arch not in ARCH_MODEL_REGISTRY:
        # fairseq itself dies here with "IndexError: Replacement index 1 out of range".
        raise CheckpointError(
            f"checkpoint {path} was trained with architecture {arch!r}, which is not registered: "
            "load the plugin that defines it (fairseq: --user-dir)"
        )
    check_config_types(state, path, arch)


def checkpoint_architecture(state):
    """The ``--arch`` (or hydra ``model._name``) of a loaded checkpoint state."""
    if state.get("args") is not None:
        return getattr(state["args"], "arch", None)
    model_cfg = (state.get("cfg") or {}).get("model")
    return config_option(model_cfg, "_name") or config_option(model_cfg, "arch")


def checkpoint_task(state):
    """(task name, source language, target language) stored in a verified checkpoint
    state; each None when not stored as a string."""
    args = state.get("args")
    name = config_option(args, "task") if args is not None else (
        checkpoint_task_option(state, "_name") or checkpoint_task_option(state, "task"))
    return (name if isinstance(name, str) else None, checkpoint_task_option(state, "source_lang"),
            checkpoint_task_option(state, "target_lang"))


def checkpoint_task_option(state, key):
    """A task option (``data``, ``source_lang``...) stored in a verified checkpoint state
    (its ``args``, else its ``cfg.task``); None unless it is a string."""
    args = state.get("args")
    value = config_option(args if args is not None else (state.get("cfg") or {}).get("task"), key)
    return value if isinstance(value, str) else None

