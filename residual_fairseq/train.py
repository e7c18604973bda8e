"""Train one shipped config with fairseq-train: pick by dataset/variant/depth, print, run.

The command is plain ``fairseq-train`` with the config rendered as flags
(:func:`residual_fairseq.configs.fairseq_train_args`) and any extra fairseq flags
appended, so it can be copied and run by hand. fairseq itself resumes from
``SAVE_DIR/checkpoint_last.pt``. The driver copies fairseq's output (JSON log lines)
into ``SAVE_DIR/train.log`` (appending on resume; fairseq's own ``--log-file`` keeps
only some loggers, not the validation stats) and records the choice of config in
``SAVE_DIR/run.json`` (read back by fine-tuning and reproduce).

Launch modes:

- one process: one GPU, or the CPU when CUDA is missing (fp16/amp are then turned off);
- ``--nprocs N`` with CUDA: fairseq's own launcher spawns N GPU workers;
- ``--nprocs N`` on CPU: N ranks started by hand with gloo and ``legacy_ddp`` (the
  only CPU multi-process setup that works with fairseq 0.12 here).
For multi-node GPU jobs run the printed command under your launcher (see docs/training.md).

CLI::

    residual-fairseq-train --dataset iwslt14-de-en --variant resi_dual --layers 12 \\
        --data data/iwslt14/bin --save-dir checkpoints/iwslt-resi_dual-12 -- --max-epoch 50
"""
import argparse
import contextlib
import ctypes
import fcntl
import json
import math
import os
import random
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

from . import USER_DIR, configs, early_stopping
from .argtypes import MAX_SEED, check_output_dir, int_at_least, positive_int
from .data import binarized
from .errors import UserError, cli_main
from .passthrough import refuse_flags
from .runtime import (
    add_threads_flag, add_verbose_flag, fairseq_executable, resolve_threads, thread_environment, threads_note,
)
from .checkpoints import read_checkpoint, repair_last_checkpoint
from .variants import VARIANTS, needs_profile

LOG_NAME = "train.log"
CUDA_ONLY_FLAGS = tuple(configs.flag(name) for names in configs.CUDA_ONLY_SETTINGS.values() for name in names)
RUN_RECORD_NAME = "run.json"


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
        source_lang, target_lang = language_pair(data, request.source_lang, request.target_lang, configured)
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


# --- languages, sizes and names -----------------------------------------------------------

_BINARY_PAIR = re.compile(r"^train\d*\.([^.\-]+)-([^.\-]+)\.[^.]+\.(bin|idx)$")


def data_language_pairs(data) -> list:
    """The (source, target) pairs of a fairseq data directory's train files, as binarized."""
    return sorted({match.groups()[:2] for match in map(_BINARY_PAIR.match, os.listdir(data)) if match})


def language_pair(data, source_lang=None, target_lang=None, configured=(None, None)):
    """The (source, target) to train: -s/-t if given, else the config's pair when the data
    hold it, else the data's one pair. Either direction of a binarized pair is trainable."""
    binarized = data_language_pairs(data)
    if not binarized:
        raise UserError(f"{data} holds no training data (train.SRC-TGT.LANG.bin): pass the prepared bin/ directory")
    directions = binarized + [(tgt, src) for src, tgt in binarized if (tgt, src) not in binarized]
    shown = ", ".join(f"{src}-{tgt}" for src, tgt in binarized)
    if source_lang or target_lang:
        matching = [(src, tgt) for src, tgt in directions
                    if source_lang in (None, src) and target_lang in (None, tgt)]
        if len(matching) != 1:
            asked = f"{source_lang or '?'}->{target_lang or '?'}"
            raise UserError(f"-s/-t {asked}: {data} holds {shown}" + ("" if matching else " (no such pair)"))
        return matching[0]
    if None not in configured and tuple(configured) in directions:
        return tuple(configured)
    if len(binarized) == 1:
        return binarized[0]
    raise UserError(f"{data} holds several language pairs ({shown}): choose one with -s/-t")


def passthrough_value(extra_args, flag: str):
    """The value of the last ``flag VALUE`` / ``flag=VALUE`` among fairseq-train passthrough
    flags (``--a-b`` also spelled ``--a_b``); None if it is not given a value."""
    extra, found = list(extra_args), None
    for index, word in enumerate(extra):
        name, equals, value = word.partition("=")
        if name.replace("_", "-") == flag:
            value = value if equals else (extra[index + 1] if index + 1 < len(extra) else None)
            found = found if value is None else value
    return found


def check_data(data, settings: dict, extra_args=()) -> None:
    """The dictionaries and the splits fairseq-train will read are whole and belong together
    (:mod:`residual_fairseq.data.binarized`), before fairseq starts."""
    dataset = settings.get("dataset", {})
    splits = [passthrough_value(extra_args, "--train-subset") or dataset.get("train_subset") or "train"]
    if "--disable-validation" not in extra_args and not dataset.get("disable_validation"):
        valid = passthrough_value(extra_args, "--valid-subset") or dataset.get("valid_subset") or "valid"
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
        value = passthrough_value(extra_args, "--" + key.replace("_", "-"))
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
    for index, word in enumerate(extra):
        name, equals, value = word.partition("=")
        if name not in POSITIVE_FLAGS:
            continue
        value = value if equals else (extra[index + 1] if index + 1 < len(extra) else "")
        for item in value.split(","):
            try:
                number = float(item)
            except ValueError:
                raise UserError(f"{name} {value!r}: expected a number") from None
            if not math.isfinite(number) or number <= 0:
                raise UserError(f"{name} must be a finite positive number, got {item}")


def admin_profile_path(save_dir) -> Path:
    from .admin_profile import PROFILE_NAME

    return Path(save_dir) / PROFILE_NAME


def ensure_admin_profile(request: TrainRequest, train_plan: TrainPlan) -> None:
    """Admin's first step: profile the omegas into SAVE_DIR, unless already there or resuming."""
    from .admin_profile import profile_for_training

    path = admin_profile_path(request.save_dir)
    if path.is_file() or (Path(request.save_dir) / "checkpoint_last.pt").is_file():
        return
    command = list(train_plan.commands[0][1:])
    index = command.index("--admin-profile")
    del command[index:index + 2]
    print(f"profiling Admin's omegas on the first training batch -> {path}", flush=True)
    profile_for_training(command, path)


def write_run_record(request: TrainRequest, train_plan: TrainPlan) -> Path:
    """``SAVE_DIR/run.json``: which config trained this directory, and how."""
    save_dir = Path(request.save_dir)
    save_dir.mkdir(parents=True, exist_ok=True)
    task = train_plan.settings["task"]
    model = train_plan.model or effective_model(train_plan.settings, request.extra_args)
    record = {
        "name": run_name(request.variant, model),
        "dataset": request.dataset, "variant": request.variant,
        # "layers": the encoder depth, as before (fine-tuning reads it); the real sizes are in "model".
        "layers": model.get("encoder_layers", request.layers),
        "encoder_layers": model.get("encoder_layers"), "decoder_layers": model.get("decoder_layers"),
        "model": model, "source_lang": task.get("source_lang"), "target_lang": task.get("target_lang"),
        "seed": train_plan.settings["common"].get("seed"), "data": str(Path(request.data).resolve()),
        "threads": train_plan.threads,
        "extra_args": list(request.extra_args), "commands": [shlex.join(c) for c in train_plan.commands],
    }
    path = save_dir / RUN_RECORD_NAME
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path


def read_run_record(save_dir) -> Optional[dict]:
    """``SAVE_DIR/run.json`` (None when there is none), checked: it comes with a checkpoint
    someone handed over, so one that this tool did not write is a one-line UserError."""
    path = Path(save_dir) / RUN_RECORD_NAME
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        record, problem = None, f"cannot be read ({err.__class__.__name__})"
    else:
        problem = _run_record_problem(record)
    if problem:
        raise UserError(f"{path} {problem}: it is not a run record residual-fairseq-train wrote")
    return record


def _run_record_problem(record) -> Optional[str]:
    if not isinstance(record, dict):
        return "is not a JSON object"
    for key in ("dataset", "variant", "data"):
        if not isinstance(record.get(key), str):
            return f"has no '{key}' string"
    for key, required in (("layers", True), ("decoder_layers", False)):
        value = record.get(key)
        if (value is not None or required) and not (type(value) is int and 1 <= value <= configs.MAX_LAYERS):
            return f"has no '{key}' from 1 to {configs.MAX_LAYERS}"
    return None


_STATS_LINE = re.compile(r"\| (train_inner|train|valid) \| (\{.*\})\s*$")
_BATCHES_LINE = re.compile(r"grouped total_num_itrs = (\d+)")
_ERROR_LINE = re.compile(r"^(\S+: )?error: ")  # argparse's and the plugin's one-line errors
_LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \| (\w+) \|")


class ProgressDisplay:
    """A tqdm bar (updates, loss, ETA) fed with fairseq's JSON log lines, for a terminal.

    The full output still goes to train.log; on the terminal, INFO records (the config,
    the model) and Python's deprecation warnings give way to the bar, validation and
    epoch results are printed as one line each, and fairseq's WARNING/ERROR records and
    any traceback are shown as they come.
    """

    def __init__(self, max_update=0, max_epoch=0, stream=None):
        from tqdm import tqdm

        self.max_update, self.max_epoch = max_update or 0, max_epoch or 0
        self.stream = stream or sys.stdout
        self.bar = tqdm(total=self.max_update or None, unit="upd", dynamic_ncols=True, file=self.stream,
                        desc="training")
        self._showing = False        # inside a WARNING/ERROR record (its continuation lines too)
        self._in_traceback = False   # from "Traceback" on, everything is shown

    def feed(self, line: str) -> None:
        stats = _STATS_LINE.search(line)
        if stats:
            kind, values = stats.group(1), json.loads(stats.group(2))
            if kind == "train_inner":
                self.bar.update(max(0, int(float(values.get("num_updates", self.bar.n))) - self.bar.n))
                self.bar.set_postfix(epoch=values.get("epoch"), loss=values.get("loss"), lr=values.get("lr"))
            elif kind == "valid":
                shown = {key[len("valid_"):]: values[key] for key in ("valid_loss", "valid_bleu", "valid_best_loss",
                                                                        "valid_best_bleu") if key in values}
                self.write(f"epoch {values.get('epoch')} update {values.get('valid_num_updates')}: valid "
                           + ", ".join(f"{key} {value}" for key, value in shown.items()))
            else:
                self.write(f"epoch {values.get('epoch')} done: train loss {values.get('train_loss')}, "
                           f"{values.get('train_wps')} words/s")
            return
        batches = _BATCHES_LINE.search(line)
        if batches:
            if not self.max_update and self.max_epoch:
                self.bar.total = int(batches.group(1)) * self.max_epoch
                self.bar.refresh()
            return
        level = _LOG_LINE.match(line)
        if level:  # a new log record: shown when it is a warning or an error
            self._showing = level.group(1) in ("WARNING", "ERROR", "CRITICAL")
        elif line.startswith("Traceback"):
            self._showing = self._in_traceback = True
        if (self._showing or self._in_traceback or _ERROR_LINE.match(line)) and line.strip():
            self.write(line.rstrip("\n"))

    def write(self, text: str) -> None:
        """A line above the bar."""
        self.bar.write(text, file=self.stream)

    def close(self):
        self.bar.close()


def _copy_output(process, log_path: Path, to_console: bool, progress: Optional[ProgressDisplay] = None):
    """Append a process's output to ``log_path`` (and echo it, or feed it to a progress bar), line by line."""
    with open(log_path, "a", encoding="utf-8") as log:
        for line in process.stdout:
            log.write(line)
            log.flush()
            if progress is not None:
                progress.feed(line)
            elif to_console:
                sys.stdout.write(line)
                sys.stdout.flush()


def _setting(train_plan: TrainPlan, group: str, key: str, extra_args=()):
    """A config value, a later ``--key value`` passthrough flag winning."""
    value = train_plan.settings.get(group, {}).get(key)
    flag = "--" + key.replace("_", "-")
    extra = list(extra_args)
    for index, word in enumerate(extra):
        if word == flag and index + 1 < len(extra):
            value = extra[index + 1]
        elif word.startswith(flag + "="):
            value = word.split("=", 1)[1]
    try:
        return int(float(value)) if value is not None else 0
    except ValueError:
        return 0


LOCK_NAME = ".residual-fairseq-train.lock"
# After forwarding SIGTERM/SIGINT, how long fairseq-train gets to stop before SIGKILL.
STOP_GRACE_SECONDS = 30


@contextlib.contextmanager
def save_dir_lock(save_dir):
    """Hold ``SAVE_DIR/.residual-fairseq-train.lock`` (``flock``) or refuse with one line.

    The kernel releases the lock when the last process holding it ends, however it
    ends (SIGKILL included); the fairseq-train children hold it too, so the save dir
    stays locked until they are gone. Yields the lock's file descriptor.
    """
    save_dir = Path(save_dir)
    save_dir.mkdir(parents=True, exist_ok=True)
    path = save_dir / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)  # (see refuse_links_in_save_dir)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
            raise UserError(f"{save_dir} is in use by another training run (pid {holder or '?'} holds {path}): "
                            "wait for it to end, or choose another --save-dir") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield fd
    finally:
        os.close(fd)


def refuse_links_in_save_dir(save_dir) -> None:
    """Refuse a save dir where a file the run writes is a symbolic link: the driver and fairseq
    open those names for writing (the lock, train.log, run.json, checkpoints, Admin's profile)
    and would write through a planted link into whatever it points at."""
    from .admin_profile import PROFILE_NAME

    save_dir = Path(save_dir)
    if not save_dir.is_dir():
        return
    written = {LOCK_NAME, LOG_NAME, RUN_RECORD_NAME, f".{RUN_RECORD_NAME}.tmp", PROFILE_NAME}
    for path in sorted(save_dir.iterdir()):
        if path.is_symlink() and (path.name in written or
                                  (path.name.startswith("checkpoint") and path.name.endswith(".pt"))):
            raise UserError(f"{path} is a symbolic link: training writes that file and would write through the "
                            "link; remove it, or choose another --save-dir")


def refuse_resuming_another_model(request: TrainRequest, train_plan: TrainPlan) -> None:
    """fairseq would resume SAVE_DIR's checkpoint_last.pt into the model asked for (and fail on
    the first mismatched weight), after run.json had been rewritten to describe the new model:
    refuse first, naming both, while run.json still describes the checkpoints."""
    save_dir = Path(request.save_dir)
    if not (save_dir / "checkpoint_last.pt").is_file():
        return
    from .argtypes import read_regular_file

    try:
        record = json.loads(read_regular_file(save_dir / RUN_RECORD_NAME, 1 << 20, "run record"))
    except (UserError, ValueError, RecursionError):
        return  # none, or not ours: fairseq's own check on loading decides
    stored = record.get("name") if isinstance(record, dict) else None
    asked = run_name(request.variant, train_plan.model or effective_model(train_plan.settings, request.extra_args))
    if isinstance(stored, str) and stored != asked:
        raise UserError(f"--save-dir {save_dir} holds checkpoints of a {stored[:80]!r} run (its run.json), and "
                        f"fairseq would resume them as {asked}: choose another --save-dir")


def die_with_the_driver():
    """``preexec_fn`` for fairseq-train: the kernel SIGKILLs it when the driver dies, even by SIGKILL."""
    driver = os.getpid()
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux: the process-group forwarding still applies
        return None
    PR_SET_PDEATHSIG = 1

    def setup():
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != driver:  # the driver died before prctl took effect
            os._exit(1)

    return setup


@contextlib.contextmanager
def forwarding_stop_signals(processes):
    """While the block runs, SIGTERM/SIGINT to the driver go to each child's process group;
    yields a list that receives the signal numbers received."""
    received = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return

    def forward(signum, _frame):
        received.append(signum)
        for process in processes:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield received
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)


def execute(train_plan: TrainPlan, save_dir: Path, lock_fd: Optional[int] = None, progress: Optional[bool] = None,
            extra_args=(), environment=None) -> int:
    """Run the plan's processes (all at once) and return the first non-zero status, else 0.

    Rank 0's output goes to the console and ``SAVE_DIR/train.log``; rank R's to
    ``SAVE_DIR/train.rankR.log``. ``progress`` (default: stdout is a terminal) shows a
    progress bar on the console instead of rank 0's log lines. Each process runs in its own process group and dies
    with the driver: SIGTERM/SIGINT are forwarded to the groups (the driver then ends
    by the same signal), and a driver killed outright takes them with it
    (``PR_SET_PDEATHSIG``). ``lock_fd`` (the save dir's lock) is inherited by the children;
    ``environment`` adds variables to theirs.
    """
    if progress is None:
        progress = sys.stdout.isatty()
    display = None
    if progress:
        display = ProgressDisplay(_setting(train_plan, "optimization", "max_update", extra_args),
                                  _setting(train_plan, "optimization", "max_epoch", extra_args))
        display.write(f"progress bar below; fairseq's full log: {save_dir / LOG_NAME}")
    env = thread_environment(train_plan.threads)
    env.pop(early_stopping.ENVIRONMENT_VARIABLE, None)  # only this resume's count, never an inherited one
    env.update(environment or {})
    processes, copiers, failed = [], [], []
    with forwarding_stop_signals(processes) as received:
        try:
            for command in train_plan.commands:
                processes.append(subprocess.Popen(
                    command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
                    start_new_session=True, preexec_fn=die_with_the_driver(),
                    pass_fds=() if lock_fd is None else (lock_fd,), env=env,
                ))
            # Threads start after the forks: preexec_fn is only safe without other threads.
            for rank, process in enumerate(processes):
                log_path = save_dir / (LOG_NAME if rank == 0 else f"train.rank{rank}.log")
                copier = threading.Thread(target=_copy_output, args=(process, log_path, rank == 0,
                                                                     display if rank == 0 else None), daemon=True)
                copier.start()
                copiers.append(copier)
            stop_deadline = None
            while True:
                codes = [process.poll() for process in processes]
                failed = [code for code in codes if code not in (None, 0)]
                if all(code is not None for code in codes) or (failed and not received):
                    break
                if received and stop_deadline is None:
                    stop_deadline = time.monotonic() + STOP_GRACE_SECONDS
                if stop_deadline is not None and time.monotonic() > stop_deadline:
                    kill_groups(processes, signal.SIGKILL)
                time.sleep(0.2)
        except FileNotFoundError as err:
            raise UserError(f"{err.filename} not found: is fairseq installed in this environment?") from None
        finally:
            # One failed rank leaves the others waiting forever on a collective.
            kill_groups(processes, signal.SIGTERM)
            for process in processes:
                process.wait()
            for copier in copiers:
                copier.join(timeout=10)
            if display is not None:
                display.close()
    if received:
        signal.raise_signal(received[0])  # die as the signal asked (SIGINT: KeyboardInterrupt)
    return failed[0] if failed else 0


def kill_groups(processes, signum):
    for process in processes:
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signum)


def _progress(state: dict):
    """(epoch, updates) stored in a verified checkpoint state; each None when not stored as a number."""
    history = state.get("optimizer_history")
    last = history[-1] if isinstance(history, list) and history and isinstance(history[-1], dict) else {}
    extra = state.get("extra_state") if isinstance(state.get("extra_state"), dict) else {}
    iterator = extra.get("train_iterator") if isinstance(extra.get("train_iterator"), dict) else {}
    epoch, updates = iterator.get("epoch"), last.get("num_updates")
    return (epoch if isinstance(epoch, int) else None), (updates if isinstance(updates, int) else None)


def resume_point(save_dir) -> Optional[tuple]:
    """(a line saying where fairseq will resume, the updates of that checkpoint), or None
    for a new run. Checks the checkpoint and repairs a truncated one.

    fairseq resumes from ``SAVE_DIR/checkpoint_last.pt`` only. A truncated one is
    replaced by the newest valid checkpoint fairseq wrote for the run
    (:func:`~residual_fairseq.checkpoints.repair_last_checkpoint`: never averaged
    checkpoints or other files); any other problem is a one-line error.
    """
    last = Path(save_dir) / "checkpoint_last.pt"
    if not last.exists():
        return None
    repaired_from = repair_last_checkpoint(save_dir)
    epoch, updates = _progress(read_checkpoint(last))
    progress = f"epoch {'?' if epoch is None else epoch}, {'?' if updates is None else updates} updates"
    if repaired_from is not None:
        return (f"{last} was truncated (a crash while fairseq copied it); resuming from {repaired_from} "
                f"({progress}), copied to {last.name}"), updates
    return f"resuming from {last} ({progress})", updates


# fairseq does not restore its best score when these are given; nor is patience then carried on.
RESET_FLAGS = ("reset_optimizer", "reset_meters")


def _flag_given(train_plan: TrainPlan, extra_args, key: str) -> bool:
    """A boolean fairseq option (``checkpoint.reset_meters``...) set in the config or after ``--``."""
    given = {word.partition("=")[0].replace("_", "-") for word in extra_args}
    return any(bool(group.get(key)) for group in train_plan.settings.values() if isinstance(group, dict)) \
        or "--" + key.replace("_", "-") in given


def resumed_early_stopping(train_plan: TrainPlan, save_dir: Path, last_updates, extra_args=()):
    """(the patience left, the environment that carries ``--patience`` over this resume);
    the patience left is None without ``--patience`` or when the count restarts
    (:mod:`residual_fairseq.early_stopping`)."""
    patience = _setting(train_plan, "checkpoint", "patience", extra_args)
    if patience <= 0:
        return None, {}
    if any(_flag_given(train_plan, extra_args, key) for key in RESET_FLAGS):
        print("note: --reset-optimizer/--reset-meters: patience restarts from this resume", flush=True)
        return None, {}
    if last_updates is None:
        print("note: checkpoint_last.pt does not say its updates: patience restarts from this resume", flush=True)
        return None, {}
    dataset, checkpoint = train_plan.settings.get("dataset", {}), train_plan.settings.get("checkpoint", {})
    valid = passthrough_value(extra_args, "--valid-subset") or dataset.get("valid_subset") or "valid"
    metric = passthrough_value(extra_args, "--best-checkpoint-metric") or checkpoint.get(
        "best_checkpoint_metric") or "loss"
    state, line = early_stopping.resumed_state(
        save_dir / LOG_NAME, last_updates, valid.split(",")[0], metric,
        maximize=_flag_given(train_plan, extra_args, "maximize_best_checkpoint_metric"))
    print(f"note: {line}", flush=True)
    if state is None:
        return None, {}
    return max(0, patience - state["runs"]), early_stopping.environment(state)


def train(request: TrainRequest, dry_run: bool = False) -> TrainPlan:
    """Plan, print and (unless ``dry_run``) run one training; UserError if fairseq fails."""
    train_plan = plan(request)
    for note in train_plan.notes:
        print(f"note: {note}", flush=True)
    print(("would run" if dry_run else "running") + ":\n" + train_plan.describe(), flush=True)
    if dry_run:
        return train_plan
    refuse_links_in_save_dir(request.save_dir)
    refuse_resuming_another_model(request, train_plan)
    with save_dir_lock(request.save_dir) as lock_fd:
        point = resume_point(request.save_dir)
        environment = {}
        if point:
            print(f"note: {point[0]}", flush=True)
            patience_left, environment = resumed_early_stopping(train_plan, Path(request.save_dir), point[1],
                                                                request.extra_args)
            if patience_left == 0:  # fairseq would validate once more, and might move checkpoint_best.pt
                print("note: this run has already stopped early (--patience): nothing to train", flush=True)
                return train_plan
        write_run_record(request, train_plan)
        if needs_profile(request.variant):
            ensure_admin_profile(request, train_plan)
        returncode = execute(train_plan, Path(request.save_dir), lock_fd, request.progress, request.extra_args,
                             environment)
    if returncode != 0:
        raise UserError(f"fairseq-train exited {returncode} (log: {Path(request.save_dir) / LOG_NAME})")
    return train_plan


def split_passthrough(argv):
    """(our arguments, fairseq arguments after a lone ``--``)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" in argv:
        index = argv.index("--")
        return argv[:index], argv[index + 1:]
    return argv, []


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


if __name__ == "__main__":
    main()
