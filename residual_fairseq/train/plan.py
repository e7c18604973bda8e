"""The plan of a training run: which fairseq-train command(s) a request runs.

:func:`plan` composes the shipped config (:mod:`residual_fairseq.configs`) with the
request's data, save dir, languages, seed and devices, checks the data and the extra
fairseq flags (those after ``--``) before anything starts, and returns the commands
with the notes that say what was adapted. Nothing is run or written here.
"""
import argparse
import random
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

from .. import USER_DIR, configs
from ..argtypes import check_output_dir, finite_positive_float
from ..data import binarized
from ..errors import UserError
from ..passthrough import flag_given, flag_value, flag_values, refuse_flags
from ..runtime import fairseq_executable, resolve_threads, threads_note
from ..variants import needs_profile

CUDA_ONLY_FLAGS = tuple(configs.flag(name) for names in configs.CUDA_ONLY_SETTINGS.values() for name in names)


@dataclass
class TrainRequest:
    dataset: str
    variant: str
    layers: int
    data: Path
    save_dir: Path
    seed: Optional[int] = None
    nprocs: int = 1
    cpu: Optional[bool] = None           # None: CPU exactly when CUDA is missing
    source_lang: Optional[str] = None    # default: the config's pair if the data hold it, else the data's
    target_lang: Optional[str] = None
    extra_args: List[str] = field(default_factory=list)  # appended fairseq-train flags
    decoder_layers: Optional[int] = None  # default: ``layers``
    threads: Optional[int] = None        # CPU threads per process (default: runtime.default_threads)
    progress: Optional[bool] = None      # progress bar; default: when stdout is a terminal


@dataclass
class TrainPlan:
    commands: List[List[str]]            # one per process to start
    notes: List[str]                     # what was adapted, said before running
    settings: dict                       # the composed config
    model: dict = field(default_factory=dict)  # the model sizes the run really has (extra flags included)
    threads: int = 1                     # CPU threads per process

    def describe(self) -> str:
        return "\n".join(shlex.join(command) for command in self.commands)

    def number(self, group: str, key: str, extra_args=()) -> int:
        """A whole-number setting as fairseq-train will see it (``optimization.max_update``...):
        the config's, a later ``--key value`` after ``--`` winning; 0 when unset or not a number."""
        value = flag_value(extra_args, "--" + key.replace("_", "-"))
        if value is None:
            value = self.settings.get(group, {}).get(key)
        try:
            return int(float(value)) if value is not None else 0
        except (ValueError, OverflowError):  # "inf" too
            return 0

    def switched_on(self, key: str, extra_args=()) -> bool:
        """A boolean fairseq option (``checkpoint.reset_meters``...) set in the config or after ``--``."""
        return any(bool(group.get(key)) for group in self.settings.values() if isinstance(group, dict)) \
            or flag_given(extra_args, "--" + key.replace("_", "-"))


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def plan(request: TrainRequest) -> TrainPlan:
    """The fairseq-train command(s) of ``request``; nothing is run or written."""
    data = Path(request.data)
    if not data.is_dir():
        raise UserError(f"data directory not found: {data} (prepare it with residual-fairseq-prepare)")
    if not any(data.glob("dict.*.txt")) and not (data / "dict.txt").is_file():  # dict.txt: language models
        raise UserError(f"{data} holds no fairseq dictionaries (dict.*.txt): pass the prepared bin/ directory")
    if request.nprocs < 1:
        raise UserError(f"--nprocs must be at least 1, got {request.nprocs}")
    save_dir = check_output_dir(request.save_dir, "--save-dir")
    check_extra_args(request.extra_args)
    language_model = getattr(configs.DATASETS.get(request.dataset), "task", None) == "language_modeling"
    if language_model and request.decoder_layers not in (None, request.layers):
        raise UserError(f"{request.dataset} trains a language model, which has one stack: layers {request.layers} "
                        f"and decoder_layers {request.decoder_layers} differ")
    overrides = {
        "task": {"data": str(data)},
        "common": {"user_dir": USER_DIR},
        "checkpoint": {"save_dir": str(save_dir)},
    }
    if request.seed is not None:
        overrides["common"]["seed"] = request.seed
    if needs_profile(request.variant):
        # Absolute: the path is stored in every checkpoint's config and read again on loading.
        overrides["model"] = {"admin_profile": str(admin_profile_path(save_dir).absolute())}
    settings = configs.load(request.dataset, request.variant, request.layers, overrides,
                            decoder_layers=request.decoder_layers)

    notes = []
    if language_model:
        if request.source_lang or request.target_lang:
            raise UserError(f"{request.dataset} trains a language model: it has no -s/-t language pair")
        if not (data / "dict.txt").is_file():
            raise UserError(f"{data} holds no language-model dictionary (dict.txt): pass the bin/ directory "
                            f"that residual-fairseq-prepare --dataset sample-lm/wikitext-103/custom-lm wrote")
    else:
        configured = (settings["task"].get("source_lang"), settings["task"].get("target_lang"))
        source_lang, target_lang = binarized.language_pair(data, request.source_lang, request.target_lang, configured)
        if None not in configured and (source_lang, target_lang) != configured and not request.source_lang:
            notes.append(f"the {request.dataset} config is {configured[0]}-{configured[1]}; "
                         f"{data} holds {source_lang}-{target_lang}: training {source_lang}->{target_lang}")
        settings["task"].update(source_lang=source_lang, target_lang=target_lang)
    check_data(data, settings, request.extra_args)
    threads, threads_source = resolve_threads(request.threads)
    notes.append(threads_note(threads, threads_source)[len("note: "):])
    cpu = (not cuda_available()) if request.cpu is None else request.cpu
    if cpu:
        settings["common"]["cpu"] = True
        # fairseq would stop on them after starting (fp16: "not compiled with CUDA"; bf16 means TPU there)
        refuse_flags(request.extra_args, CUDA_ONLY_FLAGS, "after --: needs CUDA, and this run trains on CPU"
                     + (" (--cpu)" if request.cpu else " (no CUDA on this machine)"))
        dropped = configs.drop_cuda_only_settings(settings)
        reason = "no CUDA on this machine" if request.cpu is None else "--cpu"
        notes.append(f"{reason}: training on CPU"
                     + (f" without {', '.join(dropped)} (they need CUDA)" if dropped else ""))
    if (save_dir / "checkpoint_last.pt").is_file():
        notes.append(f"fairseq will resume from {save_dir / 'checkpoint_last.pt'}")

    base = [fairseq_executable("fairseq-train")] + configs.fairseq_train_args(settings) + list(request.extra_args)
    if request.nprocs > 1:
        # Without it, rank 0 sends the resumed state to the others through
        # torch.load of an in-memory pickle, which weights-only loading refuses.
        base.append("--load-checkpoint-on-all-dp-ranks")
    if request.nprocs == 1:
        commands = [base]
    elif not cpu:
        # fairseq spawns one worker per GPU itself.
        commands = [base + ["--distributed-world-size", str(request.nprocs)]]
    else:
        port = random.Random(str(save_dir.resolve())).randint(20000, 40000)
        shared = base + [
            "--distributed-world-size", str(request.nprocs), "--distributed-init-method", f"tcp://127.0.0.1:{port}",
            "--distributed-no-spawn", "--distributed-backend", "gloo", "--ddp-backend", "legacy_ddp",
        ]
        commands = [shared + ["--distributed-rank", str(rank)] for rank in range(request.nprocs)]
        notes.append(f"{request.nprocs} CPU processes: gloo ranks started by hand, legacy_ddp")
    return TrainPlan(commands, notes, settings, effective_model(settings, request.extra_args), threads)


def check_data(data, settings: dict, extra_args=()) -> None:
    """The dictionaries and the splits fairseq-train will read are whole and belong together
    (:mod:`residual_fairseq.data.binarized`), before fairseq starts."""
    dataset = settings.get("dataset", {})
    splits = [flag_value(extra_args, "--train-subset") or dataset.get("train_subset") or "train"]
    if "--disable-validation" not in extra_args and not dataset.get("disable_validation"):
        valid = flag_value(extra_args, "--valid-subset") or dataset.get("valid_subset") or "valid"
        splits += [split for split in valid.split(",") if split]
    if settings["task"].get("_name") == "language_modeling":
        binarized.check_language_model_data(data, splits)
    else:
        binarized.check_translation_data(data, settings["task"]["source_lang"], settings["task"]["target_lang"],
                                         splits, shared_embeddings=bool(settings["model"].get("share_all_embeddings")))


# fairseq-train flags that change the model's size, and their config keys.
SIZE_FLAGS = ("encoder_layers", "decoder_layers", "encoder_embed_dim", "decoder_embed_dim",
              "encoder_ffn_embed_dim", "decoder_ffn_embed_dim", "encoder_attention_heads", "decoder_attention_heads")


def effective_model(settings: dict, extra_args=()) -> dict:
    """The model's sizes as fairseq-train will build them: the config, then any later flag."""
    model = {key: settings["model"].get(key) for key in SIZE_FLAGS}
    model["arch"] = settings["model"].get("_name")
    for key in model:
        value = flag_value(extra_args, "--" + key.replace("_", "-"))
        if value is not None:
            model[key] = value if key == "arch" else _int_or_text(value)
    return model


def _int_or_text(value):
    try:
        return int(value)
    except ValueError:
        return value


def run_name(variant: str, model: dict) -> str:
    """``<variant>-<L>l``, or ``<variant>-<E>+<D>l`` when the encoder and decoder depths differ."""
    encoder, decoder = model.get("encoder_layers"), model.get("decoder_layers")
    if encoder is None:  # a language model: decoder layers only
        return f"{variant}-{decoder}l"
    return f"{variant}-{encoder}l" if encoder == decoder else f"{variant}-{encoder}+{decoder}l"


# Passthrough flags that must be finite positive numbers: fairseq would train a model of NaNs.
POSITIVE_FLAGS = ("--dual-scale-encoder", "--dual-scale-decoder", "--lr", "--max-tokens")

# fairseq-train flags this driver sets itself from its own options. Given again after --
# (fairseq lets the later one win) they would write the checkpoints elsewhere than
# SAVE_DIR (its train.log, run.json and lock), drop the plugin, or train another task or
# language pair than run.json records: refused, one place for every driver.
DRIVER_SET_FLAGS = ("--save-dir", "--user-dir", "--task", "--source-lang", "--target-lang", "-s", "-t")
# The flags that make a run what its name says: variant (architecture and normalisation),
# depth and seed. residual-fairseq-train records them as given (run.json's model); a
# driver that names runs by its own options (residual-fairseq-reproduce) refuses them.
RUN_IDENTITY_FLAGS = ("--arch", "--encoder-layers", "--decoder-layers", "--encoder-normalize-before",
                      "--decoder-normalize-before", "--admin-profile", "--seed")


def check_extra_args(extra_args) -> None:
    """Refuse passthrough values that cannot be meant, before fairseq starts (it would fail late)."""
    extra = list(extra_args)
    refuse_flags(extra, DRIVER_SET_FLAGS, "after --: residual-fairseq-train sets it itself "
                                          "(from --save-dir, --dataset, --source-lang/--target-lang)")
    # fairseq would load that file at every start, resumes included, never SAVE_DIR's own checkpoint_last.pt.
    refuse_flags(extra, ("--restore-file",), "after --: residual-fairseq-train resumes from "
                                             "SAVE_DIR/checkpoint_last.pt itself; to start from another model "
                                             "use residual-fairseq-finetune")
    for flag in POSITIVE_FLAGS:
        for value in flag_values(extra, flag):
            for item in (value or "").split(","):
                try:
                    finite_positive_float(item)
                except argparse.ArgumentTypeError as err:
                    raise UserError(f"{flag} {err}") from None


def admin_profile_path(save_dir) -> Path:
    from ..admin_profile import PROFILE_NAME

    return Path(save_dir) / PROFILE_NAME


