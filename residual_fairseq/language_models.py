"""Language models from Python and the tools: test perplexity, sampling, beam search.

Perplexity is fairseq's own ``fairseq-eval-lm`` (run as a subprocess, exactly the
command printed), with the ``--tokens-per-sample``/``--context-window`` settings of
fairseq's ``examples/language_model`` (a window of ``context_window`` tokens of
context for each scored token)::

    from residual_fairseq.language_models import evaluate_lm, load_language_model
    result = evaluate_lm("checkpoints/lm/checkpoint_best.pt", "data/sample-lm/bin",
                         tokens_per_sample=128, context_window=64)
    result["perplexity"]

    lm = load_language_model("checkpoints/lm/checkpoint_best.pt", data="data/sample-lm/bin")
    lm.sample("And God said", sampling=True, sampling_topk=10, temperature=0.8, max_len_b=30)
    lm.sample("And God said", beam=5)
    lm.perplexity("In the beginning God created the heaven and the earth.")

Text in and out is raw text: the sentencepiece model of a ``residual-fairseq-prepare``
output directory (``spm.model`` beside ``bin/``) is found and applied, as translate does.
"""
import json
import math
import re
import shlex
import subprocess
from pathlib import Path
from typing import List, Optional, Sequence, Union

from . import USER_DIR
from .atomic import write_text_atomically
from .errors import UserError
from .runtime import fairseq_executable, quiet_hub_batches, thread_environment
from .safe_checkpoints import read_checkpoint, verify_checkpoint_file

_RESULT_LINE = re.compile(r"Loss \(base 2\): ([0-9.]+|nan|inf), Perplexity: ([0-9.]+|nan|inf)")
_TOKENS_LINE = re.compile(r"Evaluated ([0-9,]+) tokens")


def eval_lm_command(checkpoint, data_bin, subset="test", tokens_per_sample=512, context_window=400,
                    max_tokens=4096, cpu=None, extra_args=()) -> List[str]:
    """The ``fairseq-eval-lm`` command line (fairseq's README: --tokens-per-sample 512 --context-window 400)."""
    if not 0 <= context_window < tokens_per_sample:
        raise UserError(f"--context-window must be at least 0 and below --tokens-per-sample "
                        f"({tokens_per_sample}), got {context_window}")
    command = [fairseq_executable("fairseq-eval-lm"), str(data_bin), "--path", str(checkpoint), "--user-dir", USER_DIR,
               "--gen-subset", subset, "--tokens-per-sample", str(tokens_per_sample),
               "--context-window", str(context_window), "--max-tokens", str(max_tokens),
               "--sample-break-mode", "none"]
    if cpu is None:
        import torch

        cpu = not torch.cuda.is_available()
    if cpu:
        command.append("--cpu")
    return command + list(extra_args)


def parse_eval_lm_output(text: str) -> dict:
    match = _RESULT_LINE.search(text)
    if not match:
        tail = " | ".join(line for line in text.strip().splitlines()[-3:])
        raise UserError(f"fairseq-eval-lm gave no perplexity: {tail}")
    tokens = _TOKENS_LINE.search(text)
    count = int(tokens.group(1).replace(",", "")) if tokens else None
    if count == 0:
        # fairseq-eval-lm skips blocks longer than the model's positions and then reports
        # loss 0 / perplexity 1 over nothing: that is no score.
        raise UserError("fairseq-eval-lm scored no tokens (perplexity 1.00 over nothing): is --tokens-per-sample "
                        "more than the model's max positions, or the split empty?")
    loss = float(match.group(1))
    return {"loss_base2": loss, "perplexity": float(match.group(2)), "nll_nats": loss * math.log(2),
            "tokens": count}


def evaluate_lm(checkpoint, data_bin, *, subset="test", tokens_per_sample=512, context_window=400,
                max_tokens=4096, cpu=None, extra_args=(), out_json=None, threads=None) -> dict:
    """Perplexity of ``subset`` under a language-model checkpoint (file, or directory: its checkpoint_best.pt).

    ``threads``: CPU threads of fairseq-eval-lm (default: the inherited environment).
    """
    from .data.binarized import check_language_model_data
    from .evaluate import unsplittable_path

    checkpoint = Path(checkpoint)
    if checkpoint.is_dir():
        checkpoint = checkpoint / "checkpoint_best.pt"
    verify_checkpoint_file(checkpoint)
    data_bin = Path(data_bin)
    if not (data_bin / "dict.txt").is_file():
        raise UserError(f"{data_bin} holds no language-model dictionary (dict.txt): pass the prepared bin/ directory")
    if not (data_bin / f"{subset}.bin").is_file():
        raise UserError(f"{data_bin} has no binarized {subset!r} split ({subset}.bin)")
    check_language_model_data(data_bin, [subset])
    with unsplittable_path(checkpoint) as path:  # fairseq would split a ':' in it into an ensemble
        command = eval_lm_command(path, data_bin, subset, tokens_per_sample, context_window, max_tokens, cpu,
                                  extra_args)
        print("+ " + shlex.join(command), flush=True)
        env = thread_environment(threads) if threads else None
        process = subprocess.run(command, capture_output=True, text=True, env=env)
    if process.returncode != 0:
        last = (process.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise UserError(f"fairseq-eval-lm failed (exit {process.returncode}): {last}")
    result = {"checkpoint": str(checkpoint), "data": str(data_bin), "subset": subset,
              "tokens_per_sample": tokens_per_sample, "context_window": context_window,
              **parse_eval_lm_output(process.stdout + process.stderr), "command": shlex.join(command)}
    if out_json is not None:
        write_text_atomically(out_json, json.dumps(result, indent=2) + "\n")
    return result


# --- generation from Python -------------------------------------------------------------

class LanguageModel:
    """A loaded language model with its subword model: text in, text out.

    ``hub`` is fairseq's :class:`~fairseq.hub_utils.GeneratorHubInterface`, whose
    ``sample``/``score``/``generate`` do the work (sampling, beam search, incremental
    decoding with the model's cache).
    """

    def __init__(self, hub):
        self.hub = hub

    def sample(self, prompts: Union[str, Sequence[str]], beam: int = 1, sampling: bool = False,
               max_len_b: int = 50, **options) -> Union[str, List[str]]:
        """Continue each prompt: beam search (``beam=5``) or sampling (``sampling=True``,
        ``sampling_topk``/``sampling_topp``, ``temperature``); returns prompt + continuation.

        ``max_len_b`` is fairseq's: the most tokens in all, the prompt's included.
        """
        if isinstance(prompts, str):
            return self.sample([prompts], beam, sampling, max_len_b, **options)[0]
        prompts = list(prompts)
        if not prompts:
            return []
        with quiet_hub_batches():
            return self.hub.sample(prompts, beam=beam, sampling=sampling, max_len_b=max_len_b, **options)

    def perplexity(self, text: str) -> float:
        """Perplexity of one line of text (each token scored given the tokens before it)."""
        with quiet_hub_batches():
            scores = self.hub.score(text)["positional_scores"]
        return float(scores.mean().neg().exp())


def _subword_of(data_bin: Path):
    """The hub's bpe options for the subword model beside ``data_bin`` (sentencepiece, or
    subword-nmt codes from ``--subword bpe``), found and checked as translate does."""
    from .translate import find_subword_model, subword_options

    bpe, path = find_subword_model(data_bin)
    return {} if bpe is None else {"bpe": bpe, **subword_options(bpe, path)}


def load_language_model(checkpoint, data=None, cpu: Optional[bool] = None) -> LanguageModel:
    """Load a language-model checkpoint (ResiDual or fairseq's transformer_lm) for generation.

    ``data`` is the fairseq data directory holding ``dict.txt`` (default: the
    checkpoint's training data, as stored in it).
    """
    from .translate import load_hub

    checkpoint = Path(checkpoint)
    if checkpoint.is_dir():
        checkpoint = checkpoint / "checkpoint_best.pt"
    state = read_checkpoint(checkpoint)  # read once and checked; the model is built from this state
    task, stored_data = _stored_task(state)
    if task != "language_modeling":
        raise UserError(f"{checkpoint} is a {task or 'unknown-task'} checkpoint, not a language model "
                        "(for translation models use residual_fairseq.translate)")
    if data is None:
        if not stored_data:
            raise UserError(f"{checkpoint} does not say where its data were: pass --data the prepared bin/")
        data = stored_data
    data = Path(data)
    if not (data / "dict.txt").is_file():
        raise UserError(f"{data} holds no language-model dictionary (dict.txt): pass --data the prepared bin/")
    # fairseq's hub interface, as TransformerLanguageModel.from_pretrained builds it, but
    # without a second open of the file by name (nor from_pretrained's split on ':').
    hub = load_hub(checkpoint, data, state=state, **_subword_of(data))
    if cpu is False:
        hub.cuda()
    elif cpu is None:
        import torch

        if torch.cuda.is_available():
            hub.cuda()
    hub.eval()
    return LanguageModel(hub)


def _stored_task(state: dict):
    """(task name, data directory) as stored in a verified checkpoint state."""
    cfg = state.get("cfg") or {}
    task = cfg.get("task") if isinstance(cfg, dict) else None
    if isinstance(task, dict):
        return task.get("_name"), task.get("data")
    args = state.get("args")
    return getattr(args, "task", None), getattr(args, "data", None)
