"""Translate text with a trained ResiDual checkpoint, from Python or the command line.

A thin layer over fairseq's hub interface (``fairseq.hub_utils.GeneratorHubInterface``,
what ``ResiDualModel.from_pretrained`` returns, built from a verified checkpoint): the checkpoint, its dictionaries, its subword model
(subword-nmt codes or sentencepiece) and, when the data were Moses-tokenized, the
tokenizer, so raw text goes in and detokenized text comes out::

    from residual_fairseq.translate import load_translator
    translator = load_translator("checkpoints/checkpoint_best.pt", data="data/sample.prepared/bin")
    translator.translate("En el principio creó Dios los cielos y la tierra.")
    translator.translate(["Primera frase.", "Segunda frase."], beam=5)

Command line (one sentence per line, stdin or --input, translations on stdout)::

    echo "Hola mundo." | residual-fairseq-translate checkpoints/ --data data/sample.prepared/bin

Bad input: an empty input is an error; an empty line translates to an empty line; a
sentence longer than the model's source positions (after tokenization and subwords,
counting the end-of-sentence token) is an error naming the sentence and both lengths
(:class:`SentenceTooLongError`) - it is never silently truncated. A checkpoint whose stored
positions are not a positive count (``max_source_positions = -5``) is refused on loading.

Stopping early (the command line): stdout only ever holds the translations of the first N
input lines, each whole. They are written a batch (``--batch-lines``) at a time; SIGTERM and
Ctrl-C (SIGINT) that arrive while a batch is being written take effect once it is written,
and end the command with one line saying what stdout holds (``error: terminated: stdout
holds the translations of the first 64 of 300 lines, whole lines``; exit 143, or 130 for
Ctrl-C). Running out of memory while decoding ends it the same way, with exit 2 and a hint
(a smaller ``--beam`` or ``--batch-lines``).
"""
import argparse
import logging
import signal
import sys
from pathlib import Path
from typing import List, Optional, Sequence, Union

from .argtypes import int_at_least, length_penalty, positive_int, read_user_lines, decode_user_text, split_lines
from .data.binarized import dictionary_segmentation
from .errors import UserError, cli_main
from .runtime import add_threads_flag, add_verbose_flag, quiet_hub_batches, use_threads
from .checkpoints import WeightsMismatchError, checkpoint_task, config_option, load_models, read_checkpoint

# Subword model files looked for in the data directory and its parent (the
# residual-fairseq-prepare output directory), and fairseq's --bpe name for each.
SUBWORD_MODEL_FILES = (("spm.model", "sentencepiece"), ("sentencepiece.bpe.model", "sentencepiece"),
                       ("bpe.codes", "subword_nmt"), ("code", "subword_nmt"))


class SentenceTooLongError(UserError):
    """A sentence has more source tokens than the model has positions."""

    def __init__(self, index, length, limit, what="sentence"):
        self.index, self.length, self.limit = index, length, limit
        super().__init__(
            f"{what} {index + 1} is {length} tokens long after tokenization and subwords "
            f"(with </s>); this model takes at most {limit}: split it"
        )


class Translator:
    """A loaded model with its pre- and post-processing: text in, text out.

    ``hub`` is fairseq's :class:`~fairseq.hub_utils.GeneratorHubInterface` (its
    ``models``, ``task``, ``encode``/``decode`` are there for anything beyond text).
    """

    def __init__(self, hub):
        self.hub = hub
        positions = hub.max_positions
        self.max_source_tokens = positions[0] if isinstance(positions, (tuple, list)) else positions

    def translate(self, sentences: Union[str, Sequence[str]], beam: int = 5, **generation_options
                  ) -> Union[str, List[str]]:
        """Translate one sentence (returns a str) or a list of them (returns a list).

        ``generation_options`` are fairseq generation settings, e.g. ``lenpen=0.6``,
        ``max_len_b=50``. Empty sentences come back empty without running the model.
        """
        if isinstance(sentences, str):
            return self.translate([sentences], beam=beam, **generation_options)[0]
        if not isinstance(beam, int) or beam < 1:
            raise UserError(f"beam must be a positive integer, got {beam!r}")
        sentences = list(sentences)
        todo, tokens = self._encode(sentences)
        translations = [""] * len(sentences)
        if tokens:
            with quiet_hub_batches():
                hypotheses = self.hub.generate(tokens, beam=beam, **generation_options)
            for i, nbest in zip(todo, hypotheses):
                translations[i] = self.hub.decode(nbest[0]["tokens"])
        return translations


    def check_lengths(self, sentences: Sequence[str]) -> None:
        """Raise :class:`SentenceTooLongError` for the first sentence longer than the model
        takes (the CLI checks every line before it prints the first translation)."""
        self._encode(list(sentences))

    def _encode(self, sentences):
        """(indices of the non-empty sentences, their source tokens), lengths checked."""
        todo = [i for i, sentence in enumerate(sentences) if sentence.strip()]
        tokens = [self.hub.encode(sentences[i]) for i in todo]
        for i, encoded in zip(todo, tokens):
            if self.max_source_tokens is not None and len(encoded) > self.max_source_tokens:
                raise SentenceTooLongError(i, len(encoded), self.max_source_tokens)
        return todo, tokens


def find_subword_model(data_dir):
    """(fairseq bpe name, path) of a subword model in ``data_dir`` or its parent, or (None, None)."""
    for directory in (Path(data_dir), Path(data_dir).parent):
        for name, bpe in SUBWORD_MODEL_FILES:
            if (directory / name).is_file():
                return bpe, str(directory / name)
    return None, None


def check_no_subword_marks(data) -> None:
    """With ``bpe="auto"`` and no subword model found: refuse dictionaries of subword units,
    which would turn raw input into unknown words and print pieces (\u2581, @@) as output."""
    for dictionary in sorted(Path(data).glob("dict.*.txt")):
        method = dictionary_segmentation(dictionary)[0]
        if method is not None:
            flag = {"sentencepiece": "--sentencepiece-model FILE", "subword_nmt": "--bpe-codes FILE"}[method]
            raise UserError(f"{dictionary} holds {method} units, but no subword model was found in {data} or its "
                            f"parent: pass {flag} (or --bpe none for input that is already split)")


# fairseq's bpe name -> the hub option that names its model file.
SUBWORD_OPTION = {"sentencepiece": "sentencepiece_model", "subword_nmt": "bpe_codes"}


def subword_options(bpe, path) -> dict:
    """The hub option naming subword model ``path`` of fairseq bpe ``bpe``, the file checked first."""
    if bpe not in SUBWORD_OPTION:
        raise UserError(f"unknown bpe {bpe!r}; choose sentencepiece, subword_nmt, auto or none")
    option = SUBWORD_OPTION[bpe]
    if not path or not Path(path).is_file():
        raise UserError(f"{bpe} needs its model file ({option}), not found: {path}")
    from .data.subword import check_model_file

    # A garbage codes/model file: one line, not subword-nmt's or sentencepiece's traceback.
    check_model_file(path, "spm" if bpe == "sentencepiece" else "bpe")
    return {option: str(Path(path).resolve())}


def load_translator(checkpoint, data=None, *, bpe: Optional[str] = "auto", bpe_codes=None,
                    sentencepiece_model=None, tokenizer: Optional[str] = None, cpu: Optional[bool] = None,
                    **overrides) -> Translator:
    """Load a ResiDual checkpoint for translation.

    Args:
        checkpoint: a checkpoint file, or a directory holding ``checkpoint_best.pt``.
        data: the directory with the model's ``dict.<lang>.txt`` files (the data-bin it
            was trained on); default: the checkpoint's directory.
        bpe: ``"sentencepiece"``, ``"subword_nmt"``, None (no subwords), or ``"auto"``:
            from ``sentencepiece_model``/``bpe_codes`` if given, else a ``spm.model`` or
            ``bpe.codes`` file in ``data`` or its parent (residual-fairseq-prepare's layout).
        tokenizer: ``"moses"`` when the training data were Moses-tokenized, else None.
            fairseq's Moses tokenizer splits dashes aggressively (``-a``) unless
            ``moses_no_dash_splits=True`` is passed.
        cpu: force CPU; default: GPU when CUDA is available.
        overrides: further fairseq config overrides (e.g. ``moses_no_dash_splits=True``,
            ``max_tokens=4000``), as for ``from_pretrained``.
    """
    checkpoint = checkpoint_file(checkpoint)
    state = read_checkpoint(checkpoint)  # the file is read (and checked) once, before anything else
    data = Path(data) if data is not None else checkpoint.parent
    task, source_lang, target_lang = checkpoint_task(state)
    if task is not None and task != "translation":
        raise UserError(f"checkpoint {checkpoint} is a {task} model, not a translation model"
                        + (" (for a language model: residual_fairseq.load_language_model, or "
                           "residual-fairseq-evaluate)" if task == "language_modeling" else ""))
    check_stored_positions(state, checkpoint)
    if not data.is_dir() or not any(data.glob("dict.*.txt")):
        raise UserError(f"no dict.<lang>.txt files in {data}: pass the model's data directory (data-bin)")
    for lang in (source_lang, target_lang):
        if isinstance(lang, str) and not (data / f"dict.{lang}.txt").is_file():
            raise UserError(f"checkpoint {checkpoint} translates {source_lang}->{target_lang}, but {data} has "
                            f"no dict.{lang}.txt: pass the data directory it was trained on")
    if (source_lang is None or target_lang is None) and "source_lang" not in overrides:
        from fairseq.data.data_utils import infer_language_pair

        if infer_language_pair(str(data)) == (None, None):  # what fairseq's translation task does next
            raise UserError(f"checkpoint {checkpoint} does not name its languages, and {data} holds no "
                            "binarized split (train.SRC-TGT.*) to infer them from: pass the data-bin it was "
                            "trained on")
    from .data.binarized import check_dictionaries

    check_dictionaries(data.resolve())  # as fairseq gets it (load_hub); a malformed one: one line naming it
    if bpe == "auto":
        if sentencepiece_model:
            bpe = "sentencepiece"
        elif bpe_codes:
            bpe = "subword_nmt"
        else:
            bpe, found = find_subword_model(data)
            if bpe == "sentencepiece":
                sentencepiece_model = found
            elif bpe == "subword_nmt":
                bpe_codes = found
            else:
                check_no_subword_marks(data)
    if bpe is not None:
        overrides.update(subword_options(bpe, {"sentencepiece": sentencepiece_model,
                                               "subword_nmt": bpe_codes}.get(bpe)))
    hub = load_hub(checkpoint, data, state=state, bpe=bpe, tokenizer=tokenizer, **overrides)
    decode_with_defaults(hub.cfg, overrides)
    refuse_non_finite_weights(hub.models, checkpoint)
    if cpu is None:
        import torch

        cpu = not torch.cuda.is_available()
    if not cpu:
        hub.cuda()
    hub.eval()
    return Translator(hub)


def checkpoint_file(checkpoint) -> Path:
    """The checkpoint file ``checkpoint`` names: the file itself, or a directory's ``checkpoint_best.pt``."""
    checkpoint = Path(checkpoint)
    if not checkpoint.is_dir():
        return checkpoint
    best = checkpoint / "checkpoint_best.pt"
    if best.exists():
        return best
    found = sorted(path.name for path in checkpoint.glob("*.pt"))
    holds = (f" (it holds {', '.join(found[:3])}{', ...' if len(found) > 3 else ''})" if found
             else " (it holds no .pt file)")
    example = "checkpoint_last.pt" if "checkpoint_last.pt" in found else (found or ["checkpoint_best.pt"])[0]
    raise UserError(f"{checkpoint} is a directory without checkpoint_best.pt{holds}: give a checkpoint file, "
                    f"e.g. {checkpoint / example}")


# The stored limits on sentence lengths: fairseq takes the smallest of the task's and the model's.
POSITION_OPTIONS = ("max_source_positions", "max_target_positions")


def check_stored_positions(state, checkpoint) -> None:
    """Refuse a checkpoint whose stored position limits are not positive whole numbers: fairseq
    would take ``max_source_positions = -5`` as the model's limit and blame every input line
    for being longer than it (or fail building position tables from it)."""
    args = state.get("args")
    cfg = state.get("cfg") or {}
    sections = {"args": args} if args is not None else {f"cfg.{name}": config_option(cfg, name)
                                                          for name in ("task", "model")}
    for section, options in sections.items():
        for name in POSITION_OPTIONS:
            value = config_option(options, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                shown = repr(value) if isinstance(value, (int, float)) else repr(str(value)[:40])
                raise UserError(f"checkpoint {checkpoint} stores {section}.{name} = {shown}, not a "
                                "positive number of positions: its config is damaged (fix that value, or use "
                                "another checkpoint)")


def refuse_non_finite_weights(models, checkpoint) -> None:
    """A diverged run's weights (NaN/inf) give NaN scores, which fairseq's beam search meets
    with an assertion deep inside it: say so once, on loading."""
    import torch

    for model in models:
        for name, weights in model.named_parameters():
            if not torch.isfinite(weights).all():
                raise UserError(f"checkpoint {checkpoint} holds NaN or infinite weights ({name}): a diverged "
                                "run's, which cannot translate")


def decode_with_defaults(cfg, overrides) -> None:
    """How to decode is the caller's choice, not the checkpoint's: fairseq's hub decodes with the
    generation settings and batch limits stored in it, where sampling, a temperature of 0,
    constraints, NaN lengths or ``max_tokens=1`` change or break every translation. Reset them to
    fairseq's defaults, then apply the caller's own ``overrides``."""
    from fairseq.dataclass.configs import GenerationConfig
    from omegaconf import OmegaConf, open_dict

    with open_dict(cfg):
        cfg.generation = OmegaConf.structured(GenerationConfig)
        for name in ("max_tokens", "batch_size"):
            cfg.dataset[name] = None
        for name, value in overrides.items():
            for section in (cfg.generation, cfg.dataset):
                if name in section:
                    section[name] = value


def load_hub(checkpoint, data, state=None, **overrides):
    """fairseq's hub interface for one checkpoint file, as ``from_pretrained`` builds it,
    but opened once and verified (:func:`~residual_fairseq.checkpoints.load_models`;
    ``state``: its :func:`~residual_fairseq.checkpoints.read_checkpoint` result, if
    already read). ``from_pretrained`` would split the file name on ``:`` into an ensemble."""
    from fairseq.hub_utils import GeneratorHubInterface

    try:
        models, cfg, task = load_models(checkpoint, arg_overrides={"data": str(Path(data).resolve()), **overrides},
                                        state=state)
    except WeightsMismatchError as err:
        raise UserError(f"the dictionaries in {data} do not match checkpoint {checkpoint}: {err.detail}") from None
    return GeneratorHubInterface(cfg, task, models)


def build_parser():
    parser = argparse.ArgumentParser(
        prog="residual-fairseq-translate",
        description="Translate lines of text (stdin or --input) with a ResiDual checkpoint; one translation per line on stdout.",
    )
    parser.add_argument("checkpoint", help="checkpoint file, or a directory with checkpoint_best.pt")
    parser.add_argument("--data", help="directory with the model's dict.<lang>.txt (default: the checkpoint's directory)")
    parser.add_argument("--input", help="file to translate, one sentence per line (default: stdin)")
    parser.add_argument("--bpe", default="auto", choices=["auto", "sentencepiece", "subword_nmt", "none"],
                        help="subword model type (default: auto, from the files given or found beside --data)")
    parser.add_argument("--bpe-codes", help="subword-nmt codes file")
    parser.add_argument("--sentencepiece-model", help="sentencepiece .model file")
    parser.add_argument("--tokenizer", choices=["moses", "none"], default="none",
                        help="moses when the training data were Moses-tokenized")
    parser.add_argument("--beam", type=int_at_least(1, MAX_BEAM), default=5)
    parser.add_argument("--lenpen", type=length_penalty, default=1.0)
    parser.add_argument("--batch-lines", type=positive_int, default=64, help="lines translated per batch (default: 64)")
    parser.add_argument("--cpu", action="store_true", default=None)
    add_threads_flag(parser)
    add_verbose_flag(parser)
    return parser


# A beam wider than this cannot be meant (and would try to allocate beam x vocabulary scores per step).
MAX_BEAM = 1000


def read_input(path):
    """The lines to translate: UTF-8 (or UTF-16/32 with a byte-order mark), else a one-line error."""
    if path is None:
        stdin = getattr(sys.stdin, "buffer", None)
        data = stdin.read() if stdin is not None else sys.stdin.read().encode("utf-8")
        return split_lines(decode_user_text(data, "standard input"))
    if not Path(path).exists():
        raise UserError(f"input file not found: {path}")
    return read_user_lines(path, f"--input {path}")


class Terminated(BaseException):
    """SIGTERM arrived (raised like KeyboardInterrupt for SIGINT, so no ``except Exception`` catches it)."""


def _stop_exception(signum) -> BaseException:
    return KeyboardInterrupt() if signum == signal.SIGINT else Terminated()


class WholeLines:
    """stdout for translations, written whole whatever signal arrives.

    Inside ``with WholeLines() as output:`` SIGINT and SIGTERM raise KeyboardInterrupt and
    :class:`Terminated`, except during :meth:`write`: its text is written whole and flushed,
    then a signal that arrived meanwhile takes effect. ``lines`` counts the lines written.
    """

    def __init__(self):
        self.lines, self._writing, self._pending, self._previous = 0, False, [], {}

    def _stop(self, signum, frame):
        if self._writing:
            self._pending.append(signum)
        else:
            raise _stop_exception(signum)

    def write(self, lines: Sequence[str]) -> None:
        self._writing = True
        try:
            sys.stdout.write("".join(line + "\n" for line in lines))
            sys.stdout.flush()
            self.lines += len(lines)
        finally:
            self._writing = False
        if self._pending:
            raise _stop_exception(self._pending[0])

    def __enter__(self):
        for signum in (signal.SIGINT, signal.SIGTERM):
            try:
                self._previous[signum] = signal.signal(signum, self._stop)
            except ValueError:  # not the main thread: signals stay as they are
                pass
        return self

    def __exit__(self, *exc_info):
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)


def is_out_of_memory(error: BaseException) -> bool:
    """Python's MemoryError, torch's OutOfMemoryError (CUDA), or the CPU allocator's RuntimeError
    (``DefaultCPUAllocator: can't allocate memory``)."""
    import torch

    if isinstance(error, (MemoryError, getattr(torch, "OutOfMemoryError", MemoryError))):
        return True
    return isinstance(error, RuntimeError) and any(
        text in str(error) for text in ("can't allocate memory", "Cannot allocate memory", "out of memory"))


def stdout_holds(done: int, total: int) -> str:
    """What stdout holds after the first ``done`` of ``total`` lines were translated."""
    if done == 0:
        return "nothing was written to stdout"
    return f"stdout holds the translations of the first {done} of {total} lines, whole lines"


@cli_main
def main(argv=None):
    args = build_parser().parse_args(argv)
    total = None
    with WholeLines() as output:
        try:
            lines = read_input(args.input)
            total = len(lines)
            translate_lines(args, lines, output)
            return
        except Terminated:
            stopped = "terminated"
        except KeyboardInterrupt:
            stopped = "interrupted"
    # Here no signal is deferred any more, and the stopped decoding's frames are gone.
    print(f"error: {stopped}" + (f": {stdout_holds(output.lines, total)}" if total else ""), file=sys.stderr)
    sys.exit(143 if stopped == "terminated" else 130)


def translate_lines(args, lines, output: WholeLines) -> None:
    """Translate ``lines`` as ``args`` say, writing each batch's translations to ``output``."""
    # stdout carries the translations; keep fairseq's INFO chatter (its whole config) off stderr too.
    logging.getLogger("fairseq").setLevel(logging.WARNING)
    if not any(line.strip() for line in lines):
        raise UserError("empty input: nothing to translate (give sentences on stdin or with --input)")
    # stdout is for translations: the thread note goes to stderr, and only on a terminal, so that
    # scripts reading stderr see nothing but errors.
    use_threads(args.threads, announce=(lambda note: print(note, file=sys.stderr)) if sys.stderr.isatty() else None)
    translator = load_translator(
        args.checkpoint, args.data, bpe=None if args.bpe == "none" else args.bpe, bpe_codes=args.bpe_codes,
        sentencepiece_model=args.sentencepiece_model, tokenizer=None if args.tokenizer == "none" else args.tokenizer,
        cpu=args.cpu,
    )
    try:  # every line before the first translation is printed: no output that stops half-way
        translator.check_lengths(lines)
    except SentenceTooLongError as err:
        raise SentenceTooLongError(err.index, err.length, err.limit, what="line") from err
    for start in range(0, len(lines), args.batch_lines):
        batch = lines[start:start + args.batch_lines]
        out_of_memory = False
        try:
            translations = translator.translate(batch, beam=args.beam, lenpen=args.lenpen)
        except (MemoryError, RuntimeError) as err:
            if not is_out_of_memory(err):
                raise
            out_of_memory = True  # raised below, once this block has let go of the failed batch's tensors
        if out_of_memory:
            raise UserError(f"out of memory translating lines {start + 1}-{start + len(batch)} with --beam "
                            f"{args.beam} and --batch-lines {args.batch_lines}: try a smaller --beam or "
                            f"--batch-lines ({stdout_holds(output.lines, len(lines))})")
        output.write(translations)


if __name__ == "__main__":
    main()
