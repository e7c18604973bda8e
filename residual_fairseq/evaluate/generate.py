"""fairseq-generate for an evaluation: its command line, its run, and the scores of its output.

The command gets ``--remove-bpe <subword>`` (the method given, or the one
residual-fairseq-prepare recorded in the manifest beside the data), so its H/T lines come back
without subword marks; hypotheses and references are then detokenized with sacremoses when
the data were Moses-tokenized, and scored by :mod:`residual_fairseq.scoring`.
"""
import os
import re
import shlex
import subprocess
from pathlib import Path
from typing import Sequence

from .. import USER_DIR
from ..argtypes import read_user_lines
from ..atomic import atomic_output
from ..data.binarized import SENTENCEPIECE_MARK, dictionary_segmentation
from ..errors import UserError
from ..passthrough import refuse_flags
from ..runtime import fairseq_executable, thread_environment
from ..scoring import score_translations
from ..supervise import die_with_the_driver

# fairseq-generate's --remove-bpe value for each way the data may be segmented; the
# data pipeline's method names (bpe, spm-bpe, spm-unigram) are accepted too.
REMOVE_BPE = {
    "subword_nmt": "subword_nmt", "bpe": "subword_nmt",
    "sentencepiece": "sentencepiece", "spm": "sentencepiece", "spm-bpe": "sentencepiece",
    "spm-unigram": "sentencepiece",
    "none": None,
}

_GENERATE_LINE = re.compile(r"^([HT])-(\d+)\t(.*)$")


# fairseq-generate flags that generate_command sets itself and that change what is
# decoded or scored, and --results-path, which would send the output to files instead of
# the stdout parsed here: given again in --generate-args the later one would win, and the
# result would say beam 5 on the test set of what fairseq decoded otherwise. (Batching
# flags, --max-tokens and --batch-size, may be given: they change no hypothesis, and the
# result records the extra flags.) --required-batch-size-multiple > 1 drops sentences.
GENERATE_OWN_FLAGS = (
    "--path", "--user-dir", "--gen-subset", "--beam", "--lenpen", "--required-batch-size-multiple",
    "--remove-bpe", "--post-process", "--cpu", "--results-path",
)  # not -s/-t or --task: the evaluation does not set them, and a data-bin of both directions needs -s/-t


# fairseq-generate flags after which its H lines are no test translation of the model, so that
# the scores would be of something else (exit 0, a plausible number in the result):
# --score-reference scores the references themselves as the hypotheses (sacreBLEU ~100);
# --prefix-size N forces the reference's first N tokens into each hypothesis; --sampling
# (and its --sampling-topk/-topp) and --retain-dropout (dropout on while decoding) draw random
# translations, another on every run. Decoding settings that still give the model's own
# deterministic translation (--max-len-b, --no-repeat-ngram-size, --nbest, --temperature,
# --print-alignment, which adds A lines only, ...) are allowed and recorded in the result.
GENERATE_UNSCORABLE_FLAGS = ("--score-reference", "--prefix-size", "--sampling", "--sampling-topk",
                             "--sampling-topp", "--retain-dropout")


def check_generate_extra_args(extra_args, instead="use residual-fairseq-evaluate's own --subset, --beam, "
                                                    "--lenpen, --subword, --cpu") -> None:
    """Refuse extra fairseq-generate flags that would override the evaluation's own settings
    (``instead``: what the calling tool offers for them), that make its output no test
    translation (:data:`GENERATE_UNSCORABLE_FLAGS`), or that are given twice (fairseq would
    take the last, and the result records both)."""
    refuse_flags(extra_args, GENERATE_OWN_FLAGS, f"in --generate-args: the evaluation sets it itself ({instead})")
    refuse_flags(extra_args, GENERATE_UNSCORABLE_FLAGS,
                 "in --generate-args: fairseq-generate would then print no test translation of the model "
                 "(references scored as hypotheses, reference prefixes or random draws), so its scores "
                 "would mean nothing")
    refuse_repeated_flags(extra_args, "in --generate-args")


def refuse_repeated_flags(extra_args, where: str) -> None:
    """UserError when a ``--flag`` is given twice in ``extra_args`` (as ``--flag v`` or ``--flag=v``)."""
    seen = set()
    for word in extra_args:
        if isinstance(word, str) and word.startswith("--") and len(word) > 2:
            name = word.partition("=")[0].replace("_", "-")
            if name in seen:
                raise UserError(f"{name} is given twice {where}: fairseq would use the last one; give it once")
            seen.add(name)


def generate_command(checkpoint, data_bin, subset="test", beam=5, lenpen=1.0, max_tokens=4096,
                     batch_size=None, subword=None, cpu=None, user_dir=USER_DIR,
                     extra_args: Sequence[str] = ()):
    """The fairseq-generate command line of one evaluation, as a list."""
    check_generate_extra_args(extra_args)
    if cpu is None:
        import torch

        cpu = not torch.cuda.is_available()
    command = [
        fairseq_executable("fairseq-generate"), str(data_bin), "--path", str(checkpoint), "--user-dir", str(user_dir),
        "--gen-subset", subset, "--beam", str(beam), "--lenpen", str(lenpen),
        "--max-tokens", str(max_tokens), "--num-workers", "0",
        # fairseq's compiled batch_by_size (data_utils_fast in the ve-fairseq wheel)
        # drops the last partial batch when the batch size must be a multiple of N > 1
        # (generate's default is 8): up to 7 test sentences silently go missing.
        "--required-batch-size-multiple", "1",
    ]
    if batch_size:
        command += ["--batch-size", str(batch_size)]
    remove_bpe = remove_bpe_value(subword)
    if remove_bpe:
        command += ["--remove-bpe", remove_bpe]
    if cpu:
        command.append("--cpu")
    return command + list(extra_args)


def remove_bpe_value(subword):
    if subword is None:
        return None
    if subword not in REMOVE_BPE:
        raise UserError(f"unknown subword method {subword!r}; choose one of {', '.join(REMOVE_BPE)}")
    return REMOVE_BPE[subword]


class GenerateFailed(UserError):
    """fairseq-generate exited non-zero (``returncode``; ``last_line`` of its log)."""

    def __init__(self, message, returncode=None, last_line=None):
        super().__init__(message)
        self.returncode, self.last_line = returncode, last_line


def run_generate(command, output_path, threads=None, log_path=None):
    """Run fairseq-generate, its stdout into ``output_path`` (atomically), its log beside it."""
    print("running: " + shlex.join(command), flush=True)
    log_path = Path(log_path or str(output_path) + ".log")
    env = thread_environment(threads) if threads else None
    with atomic_output(output_path) as tmp, open(tmp, "w") as stdout, open(log_path, "w") as log:
        try:
            # die_with_the_driver: killed with us (SIGTERM, SIGKILL), fairseq-generate would go on
            # writing into a staging file nobody reads
            returncode = subprocess.run(command, stdout=stdout, stderr=log, env=env,
                                        preexec_fn=die_with_the_driver()).returncode
        except FileNotFoundError:
            raise UserError(f"{command[0]} not found: is fairseq installed in this environment?")
        if returncode != 0:
            log.flush()
            last = _last_line(log_path)
            raise GenerateFailed(f"fairseq-generate exited {returncode}: {last} (full log: {log_path})",
                                 returncode, last)


def binarized_size(data_bin, subset):
    """Number of sentences in a binarized split (from its .idx file)."""
    from fairseq.data import data_utils

    index = sorted(Path(data_bin).glob(f"{subset}.*.idx"))[0]
    return len(data_utils.load_indexed_dataset(str(index.with_suffix("")), None))


def read_generate_output(path):
    """(hypotheses, references) from a fairseq-generate output, in test-set order.

    The first H line of each sentence is its best hypothesis; T is its reference as
    fairseq-generate prints it (with the same --remove-bpe applied).
    """
    hypotheses, references = {}, {}
    for line in read_user_lines(path):
        match = _GENERATE_LINE.match(line)
        if not match:
            continue
        kind, sentence_id, rest = match.group(1), int(match.group(2)), match.group(3)
        if kind == "H":
            hypotheses.setdefault(sentence_id, rest.split("\t", 1)[1] if "\t" in rest else "")
        else:
            references[sentence_id] = rest
    if not hypotheses:
        raise UserError(f"no hypotheses (H-<id> lines) in {path}: not a fairseq-generate output?")
    if sorted(hypotheses) != sorted(references):
        raise UserError(f"{path}: hypotheses and references (T-<id> lines) cover different sentences")
    order = sorted(hypotheses)
    return [hypotheses[i] for i in order], [references[i] for i in order]


def detokenize(lines, lang):
    """Moses detokenization (sacremoses), which also unescapes ``&amp;`` and friends."""
    if not lang:
        return list(lines)
    from sacremoses import MosesDetokenizer

    detokenizer = MosesDetokenizer(lang=lang)
    return [detokenizer.detokenize(line.split()) for line in lines]


def read_lines(path):
    """A reference file: UTF-8 (or UTF-16/32 with a byte-order mark), else a one-line error."""
    return read_user_lines(path)


def score_generate_output(generate_output, *, detok_lang=None, compound_split=False, reference=None,
                          hypotheses_path=None) -> dict:
    """Score one fairseq-generate output file (its subword marks already removed).

    ``reference``: the raw reference file for sacreBLEU; without it the T lines,
    detokenized, are the reference. ``hypotheses_path``: where to write the
    detokenized hypotheses (one per line, test-set order).
    """
    tok_hypotheses, tok_references = read_generate_output(generate_output)
    hypotheses = detokenize(tok_hypotheses, detok_lang)
    if reference:
        references, reference_source = read_lines(reference), str(reference)
    else:
        references = detokenize(tok_references, detok_lang)
        reference_source = "fairseq-generate T lines" + (f", detokenized ({detok_lang})" if detok_lang else "")
    result = {
        "num_sentences": len(hypotheses),
        "detok_lang": detok_lang,
        "reference": reference_source,
        "generate_output": str(generate_output),
    }
    result.update(score_translations(hypotheses, references, tok_hypotheses, tok_references, compound_split))
    if hypotheses_path:
        with atomic_output(hypotheses_path) as tmp, open(tmp, "w", encoding="utf-8") as out:
            out.writelines(line + "\n" for line in hypotheses)
        result["hypotheses"] = str(hypotheses_path)
    return result


def generate_output_segmentation(hypotheses, threshold: float = 0.1):
    """``"sentencepiece"``/``"subword_nmt"`` when hypotheses still clearly carry subword marks, else None."""
    tokens = [token for line in hypotheses for token in line.split()]
    if not tokens:
        return None
    if sum(SENTENCEPIECE_MARK in token for token in tokens) >= threshold * len(tokens):
        return "sentencepiece"
    if sum(token.endswith("@@") for token in tokens) >= threshold * len(tokens):
        return "subword_nmt"
    return None



def summary(result) -> str:
    """The human-readable lines printed at the end of an evaluation."""
    lines = [
        f"{result['num_sentences']} sentences",
        f"sacreBLEU {result['sacrebleu']['score']:.2f}  ({result['sacrebleu']['signature']})",
        f"chrF      {result['chrf']['score']:.2f}  ({result['chrf']['signature']})",
    ]
    if "tokenized_bleu" in result:
        tok = result["tokenized_bleu"]
        split = ", compound-split" if tok["compound_split"] else ""
        lines.append(f"tokenized BLEU {tok['score']:.2f}  ({tok['text']}{split})")
    return "\n".join(lines)


def _last_line(path):
    lines = [line.strip() for line in Path(path).read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"



_SPLIT_FILE = r"{subset}\d*\.([^.\-]+)-([^.\-]+)\.[^.]+\.(bin|idx)$"
def prepare_manifest_of(data_bin):
    """(manifest, path) of residual-fairseq-prepare's ``OUT/manifest.json`` for ``OUT/bin``; (None, None) else."""
    from ..data.errors import DataPreparationError
    from ..data.prepared import MANIFEST_NAME, is_prepare_manifest, read_manifest

    data_bin = Path(data_bin).resolve()
    try:
        manifest = read_manifest(data_bin.parent)
    except DataPreparationError:  # not JSON: not residual-fairseq-prepare's
        return None, None
    if not is_prepare_manifest(manifest) or manifest.get("binarized", "bin") != data_bin.name:
        return None, None
    return manifest, data_bin.parent / MANIFEST_NAME


def resolve_subword(subword, data_bin, subset="test"):
    """(subword method, where it came from) for an evaluation of ``data_bin``.

    An explicit ``subword`` wins. Without one, the method recorded by residual-fairseq-prepare
    in ``OUT/manifest.json`` (beside ``OUT/bin``); without that, a target dictionary full of
    ``▁`` or ``@@`` marks is refused (scoring would compare segmented text with the references).
    """
    if subword is not None:
        remove_bpe_value(subword)  # a known method, else a one-line error
        return subword, "--subword"
    manifest, manifest_path = prepare_manifest_of(data_bin)
    if manifest is not None:
        method = manifest.get("subword", {}).get("method") if isinstance(manifest.get("subword"), dict) else None
        if not isinstance(method, str) or method not in REMOVE_BPE:
            raise UserError(f"{manifest_path} names no known subword method ({method!r}): give --subword "
                            f"({', '.join(REMOVE_BPE)})")
        print(f"subword method {method!r} from {manifest_path}", flush=True)
        return method, str(manifest_path)
    targets = sorted({match.group(2) for match in
                      map(re.compile(_SPLIT_FILE.format(subset=re.escape(subset))).match, os.listdir(data_bin))
                      if match})
    for target in targets:
        dictionary = Path(data_bin) / f"dict.{target}.txt"
        method, marked, entries = dictionary_segmentation(dictionary)
        if method:
            mark = SENTENCEPIECE_MARK if method == "sentencepiece" else "@@"
            raise UserError(f"{marked} of the {entries} entries of {dictionary} carry subword marks ({mark!r}) "
                            f"and neither --subword nor a manifest.json beside {data_bin} says how the data were "
                            f"segmented: give --subword {method} (or --subword none to score the segmented text)")
    return None, None


def resolve_detok_lang(detok_lang, data_bin, subset="test"):
    """The Moses detokenization language of an evaluation of ``data_bin``: ``detok_lang``
    when given; else, when residual-fairseq-prepare's manifest says the text was
    Moses-tokenized, the target language of ``subset`` (its split files); else None."""
    if detok_lang is not None:
        return detok_lang
    manifest, manifest_path = prepare_manifest_of(data_bin)
    settings = manifest.get("settings") if manifest is not None else None
    if not (isinstance(settings, dict) and settings.get("tokenizer") == "moses"):
        return None
    targets = sorted({match.group(2) for match in
                      map(re.compile(_SPLIT_FILE.format(subset=re.escape(subset))).match, os.listdir(data_bin))
                      if match})
    if len(targets) != 1:
        raise UserError(f"{manifest_path} says the text was Moses-tokenized, and '{subset}' has target languages "
                        f"{', '.join(targets) or 'none'}: give --detok-lang LANG (the model's target language)")
    print(f"detokenizing with Moses ({targets[0]}): {manifest_path} says the text was Moses-tokenized", flush=True)
    return targets[0]
