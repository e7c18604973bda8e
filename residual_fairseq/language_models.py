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
from .passthrough import refuse_flags
from .runtime import fairseq_executable, quiet_hub_batches, thread_environment
from .checkpoints import checkpoint_task, checkpoint_task_option, read_checkpoint

_RESULT_LINE = re.compile(r"Loss \(base 2\): ([0-9.]+|nan|inf), Perplexity: ([0-9.]+|nan|inf)")
_TOKENS_LINE = re.compile(r"Evaluated ([0-9,]+) tokens")

# fairseq-eval-lm flags that eval_lm_command sets itself (and --task, which the checkpoint's
# language_modeling must keep): given again in the extra args, the later one would win and
# fairseq would score another split, window or model than the printed result says.
EVAL_LM_OWN_FLAGS = ("--path", "--user-dir", "--gen-subset", "--tokens-per-sample", "--context-window",
                     "--max-tokens", "--sample-break-mode", "--cpu", "--task")


def check_eval_lm_extra_args(extra_args) -> None:
    """Refuse extra fairseq-eval-lm flags that would override the evaluation's own settings."""
    refuse_flags(extra_args, EVAL_LM_OWN_FLAGS,
                 "in the extra fairseq-eval-lm arguments: the evaluation sets it itself (residual-fairseq-evaluate's "
                 "own --subset, --tokens-per-sample, --context-window, --max-tokens, --cpu)")


def eval_lm_command(checkpoint, data_bin, subset="test", tokens_per_sample=512, context_window=400,
                    max_tokens=4096, cpu=None, extra_args=()) -> List[str]:
    """The ``fairseq-eval-lm`` command line (fairseq's README: --tokens-per-sample 512 --context-window 400)."""
    check_eval_lm_extra_args(extra_args)
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

    ``extra_args``: more fairseq-eval-lm flags (not those the evaluation sets itself).
    ``threads``: CPU threads of fairseq-eval-lm (default: the inherited environment).
    """
    from .data.binarized import check_language_model_data
    from .run_inputs import unsplittable_path

    check_eval_lm_extra_args(extra_args)
    checkpoint = Path(checkpoint)
    if checkpoint.is_dir():
        checkpoint = checkpoint / "checkpoint_best.pt"
    check_language_model_checkpoint(read_checkpoint(checkpoint), checkpoint)
    data_bin = Path(data_bin)
    if not (data_bin / "dict.txt").is_file():
        raise UserError(f"{data_bin} holds no language-model dictionary (dict.txt): pass the prepared bin/ directory")
    if not (data_bin / f"{subset}.bin").is_file():
        raise UserError(f"{data_bin} has no binarized {subset!r} split ({subset}.bin)")
    check_language_model_data(data_bin, [subset])
    if out_json is not None:  # checked before fairseq-eval-lm runs: never over an input
        from .argtypes import check_output_file
        from .run_inputs import data_input_files, refuse_overwriting_inputs

        check_output_file(out_json, "out_json")
        refuse_overwriting_inputs([out_json], [("the checkpoint", checkpoint)] + data_input_files(data_bin, subset),
                                  out_json, "out_json")
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

        ``max_len_b`` is fairseq's: the most tokens in all, the prompt's included (with
        ``max_len_a`` in ``options``: ``max_len_a * (longest prompt + 1) + max_len_b``),
        so it must exceed the prompt's length in tokens (after the subword model); a
        smaller one is refused (fairseq would return the prompt cut to that length).
        """
        if isinstance(prompts, str):
            return self.sample([prompts], beam, sampling, max_len_b, **options)[0]
        prompts = list(prompts)
        if not prompts:
            return []
        self._check_room(prompts, max_len_b, options.get("max_len_a", 0))
        with quiet_hub_batches():
            return self.hub.sample(prompts, beam=beam, sampling=sampling, max_len_b=max_len_b, **options)

    def prompt_tokens(self, text: str) -> int:
        """How many tokens fairseq sees for ``text`` (after the subword model; no </s>)."""
        return len(self.hub.encode(text)) - 1  # encode appends </s>

    def _check_room(self, prompts, max_len_b, max_len_a=0) -> None:
        """UserError unless fairseq's length limit leaves room for at least one token after
        every prompt (its SequenceGenerator: min(max_len_a * src_len + max_len_b, positions - 1),
        src_len the longest prompt plus the </s> that starts it)."""
        lengths = [self.prompt_tokens(prompt) for prompt in prompts]
        longest = max(lengths)
        prompt = prompts[lengths.index(longest)]
        shown = prompt if len(prompt) <= 40 else prompt[:40] + "..."
        positions = min(model.max_decoder_positions() for model in self.hub.models)
        if longest >= positions - 1:
            raise UserError(f"the prompt {shown!r} is {longest} tokens: the model's {positions} positions leave "
                            "no room for a continuation")
        limit = int(max_len_a * (longest + 1) + max_len_b)
        if limit <= longest:
            raise UserError(f"max_len_b={max_len_b} counts the prompt's tokens too (fairseq's limit on prompt + "
                            f"continuation): the prompt {shown!r} is {longest} tokens, so nothing would be "
                            f"generated (fairseq would return the prompt cut to {max(limit, 0)} tokens); "
                            f"give max_len_b above {longest - int(max_len_a * (longest + 1))}")

    def perplexity(self, text: str) -> float:
        """Perplexity of one line of text (each token scored given the tokens before it)."""
        if self.prompt_tokens(text) < 1:
            raise UserError(f"perplexity of {text!r}: the text has no tokens to score")
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
    stored_data = check_language_model_checkpoint(state, checkpoint)
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


def check_language_model_checkpoint(state: dict, checkpoint) -> Optional[str]:
    """UserError unless a verified checkpoint state is a language model; returns its stored data directory."""
    task, stored_data = checkpoint_task(state)[0], checkpoint_task_option(state, "data")
    if task != "language_modeling":
        raise UserError(f"{checkpoint} is a {task or 'unknown-task'} checkpoint, not a language model "
                        "(for translation models use residual_fairseq.translate / residual-fairseq-evaluate "
                        "with translation data)")
    return stored_data
