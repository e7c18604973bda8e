"""Evaluate a trained model: (average checkpoints,) fairseq-generate, post-process, score.

One run does, in order:

1. pick the checkpoint: a file, a directory's ``checkpoint_best.pt``, or the average
   of a directory's last N epoch/update checkpoints (:mod:`.average_checkpoints`);
2. run ``fairseq-generate`` as a subprocess (the exact command is printed and saved)
   with ``--remove-bpe <subword>`` so its H/T lines come back without subword marks;
3. detokenize hypotheses and references with sacremoses (``detok_lang``) when the
   data were Moses-tokenized;
4. score (:mod:`.scoring`): sacreBLEU + signature and chrF on the detokenized text,
   tokenized BLEU (optionally compound-split, the WMT recipe) on the text as
   fairseq-generate printed it;
5. write ``<out>.json`` (the numbers and everything needed to reproduce them), the
   detokenized hypotheses ``<out>.hyp.txt``, the raw ``<out>.generate.txt`` (+ ``.log``)
   and, when checkpoints were averaged, the averaged model ``<out>.averaged.pt``; all
   of them only once the whole run has succeeded.

Python::

    from residual_fairseq.evaluate import evaluate_run
    result = evaluate_run("checkpoints/", "data-bin/", last_n=5, subword="sentencepiece")
    print(result["sacrebleu"]["score"], result["sacrebleu"]["signature"])

CLI::

    residual-fairseq-evaluate checkpoints/ data-bin/ --last-n 5 --subword sentencepiece
"""
import argparse
import contextlib
import glob
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Optional, Sequence

from . import USER_DIR
from . import average_checkpoints as averaging
from .argtypes import (check_output_file, int_at_least, length_penalty, positive_int, read_user_lines, same_file,
                       shell_words)
from .atomic import atomic_output, process_alive
from .average_checkpoints import average_last_checkpoints
from .data.binarized import SENTENCEPIECE_MARK, check_split, dictionary_segmentation
from .errors import UserError, cli_main
from .passthrough import refuse_flags
from .runtime import (
    add_threads_flag, add_verbose_flag, fairseq_executable, resolve_threads, thread_environment, threads_note,
)
from .checkpoints import verify_checkpoint_file
from .scoring import score_translations
from .train import die_with_the_driver

# fairseq-generate's --remove-bpe value for each way the data may be segmented; the
# data pipeline's method names (bpe, spm-bpe, spm-unigram) are accepted too.
REMOVE_BPE = {
    "subword_nmt": "subword_nmt", "bpe": "subword_nmt",
    "sentencepiece": "sentencepiece", "spm": "sentencepiece", "spm-bpe": "sentencepiece",
    "spm-unigram": "sentencepiece",
    "none": None,
}

_GENERATE_LINE = re.compile(r"^([HT])-(\d+)\t(.*)$")


def pick_checkpoint(checkpoint, last_n: Optional[int] = None):
    """(checkpoint file or None when averaging, checkpoint directory); reads nothing yet."""
    checkpoint = Path(checkpoint)
    if checkpoint.is_file():
        if last_n:
            raise UserError(f"averaging the last {last_n} checkpoints needs a checkpoint directory, got a file: {checkpoint}")
        return checkpoint, checkpoint.parent
    if not checkpoint.is_dir():
        if checkpoint.exists():  # a pipe or a device
            raise UserError(f"checkpoint {checkpoint} is not a regular file")
        raise UserError(f"checkpoint not found: {checkpoint}")
    if not last_n:
        best = checkpoint / "checkpoint_best.pt"
        if not best.is_file():
            raise UserError(f"no checkpoint_best.pt in {checkpoint}: give a checkpoint file or --last-n N")
        return best, checkpoint
    if last_n < 1:
        raise UserError(f"--last-n must be at least 1, got {last_n}")
    return None, checkpoint


def resolve_checkpoint(checkpoint, last_n: Optional[int] = None, update_based: bool = False,
                       averaged_path=None):
    """The checkpoint file to evaluate and the files it was made from.

    ``checkpoint`` is a file, or a directory: its ``checkpoint_best.pt``, or with
    ``last_n`` the average of its last N epoch (or update) checkpoints, written to
    ``averaged_path`` (default ``<dir>/checkpoint.avg_last<N>[_updates].pt``).
    :func:`evaluate_run` averages beside its result file instead (``<out>.averaged.pt``).
    """
    checkpoint_file, directory = pick_checkpoint(checkpoint, last_n)
    if checkpoint_file is not None:
        return verify_checkpoint_file(checkpoint_file), [str(checkpoint_file)]
    suffix = "_updates" if update_based else ""
    averaged_path = Path(averaged_path or directory / f"checkpoint.avg_last{last_n}{suffix}.pt")
    sources = average_last_checkpoints(directory, last_n, averaged_path, update_based)
    print(f"averaged {len(sources)} checkpoints into {averaged_path}:\n  " + "\n  ".join(sources), flush=True)
    return averaged_path, sources


@contextlib.contextmanager
def unsplittable_path(checkpoint):
    """A name for ``checkpoint`` that fairseq's ``--path`` does not split into an ensemble.

    fairseq splits ``--path`` on ``:``; a file whose path holds one is passed as a
    symlink in a temporary directory instead. (fairseq-generate, with the plugin,
    checks the file again when it opens it.)
    """
    if os.pathsep not in str(checkpoint):
        yield checkpoint
        return
    with tempfile.TemporaryDirectory(prefix="residual-fairseq-evaluate.") as tmp:
        link = Path(tmp) / "checkpoint.pt"
        link.symlink_to(Path(checkpoint).resolve())
        yield link



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


def check_generate_extra_args(extra_args, instead="use residual-fairseq-evaluate's own --subset, --beam, "
                                                    "--lenpen, --subword, --cpu") -> None:
    """Refuse extra fairseq-generate flags that would override the evaluation's own settings
    (``instead``: what the calling tool offers for them)."""
    refuse_flags(extra_args, GENERATE_OWN_FLAGS, f"in --generate-args: the evaluation sets it itself ({instead})")


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


def default_result_name(subset, checkpoint_file=None, last_n=None, update_based=False, kind="eval") -> str:
    """``eval-<subset>.json`` for checkpoint_best.pt, ``eval-<subset>-<checkpoint>.json`` for any other
    file (``eval-test-checkpoint33.json``), ``eval-<subset>-avg<N>[-updates].json`` for an average."""
    if last_n:
        tag = f"-avg{last_n}" + ("-updates" if update_based else "")
    elif checkpoint_file is None or Path(checkpoint_file).name == "checkpoint_best.pt":
        tag = ""
    else:
        name = Path(checkpoint_file).name
        tag = "-" + (name[:-3] if name.endswith(".pt") and len(name) > 3 else name)
    return f"{kind}-{subset}{tag}.json"


def result_stem(out_json) -> Path:
    """``out_json`` less a final ``.json`` only: ``lp/eval-lenpen0.6`` keeps its ``.6``."""
    out_json = Path(out_json)
    name = out_json.name
    if name.lower().endswith(".json") and len(name) > len(".json"):
        return out_json.with_name(name[:-len(".json")])
    return out_json


def result_files(out_json, averaged: bool = False) -> dict:
    """Every file an evaluation writes under ``out_json``'s name, by role."""
    out_json = Path(out_json)
    stem = str(result_stem(out_json))
    files = {
        "result": out_json,
        "hypotheses": Path(f"{stem}.hyp.txt"),
        "generate_output": Path(f"{stem}.generate.txt"),
        "generate_log": Path(f"{stem}.generate.txt.log"),
        "failed_output": Path(f"{stem}.generate.failed.txt"),
        "failed_log": Path(f"{stem}.generate.failed.txt.log"),
    }
    if averaged:
        files["averaged"] = Path(f"{stem}.averaged.pt")
    return files


def refuse_overwriting_inputs(outputs, inputs, out_json, flag="--out-json") -> None:
    """UserError when a file the run would write is (or, through symlinks, resolves to) one of its inputs.

    ``outputs``: paths; ``inputs``: (description, path) pairs, e.g. ("the checkpoint", path).
    """
    for output in outputs:
        for role, path in inputs:
            if path is not None and same_file(output, path):
                written = "" if Path(output) == Path(out_json) else f" (its side file {output})"
                raise UserError(f"{flag} {out_json}{written} would overwrite {role} {path}: "
                                f"choose another result file")


def data_input_files(data_bin, subset):
    """The files of ``data_bin`` that fairseq-generate/-eval-lm read for ``subset``."""
    data_bin = Path(data_bin)
    names = [p for p in data_bin.glob("dict*.txt")]
    names += [p for p in data_bin.iterdir() if p.name.startswith(f"{subset}") and p.suffix in (".bin", ".idx")]
    return [("the data file", p) for p in sorted(names)]


_SPLIT_FILE = r"{subset}\d*\.([^.\-]+)-([^.\-]+)\.[^.]+\.(bin|idx)$"
def prepare_manifest_of(data_bin):
    """(manifest, path) of residual-fairseq-prepare's ``OUT/manifest.json`` for ``OUT/bin``; (None, None) else."""
    from .data.errors import DataPreparationError
    from .data.pipeline import MANIFEST_NAME, is_prepare_manifest, read_manifest

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


def evaluate_run(checkpoint, data_bin, *, subset="test", last_n=None, update_based=False, beam=5, lenpen=1.0,
                 max_tokens=4096, batch_size=None, subword=None, detok_lang=None, compound_split=False,
                 reference=None, out_json=None, user_dir=USER_DIR, cpu=None,
                 generate_args: Sequence[str] = (), threads: Optional[int] = None) -> dict:
    """Evaluate a checkpoint (or the average of a directory's last N) on ``data_bin``'s ``subset``.

    Args:
        checkpoint: a checkpoint file, or a directory (its ``checkpoint_best.pt``, or
            with ``last_n`` the average of its last N epoch checkpoints; with
            ``update_based`` of its last N ``checkpoint_E_U.pt`` files).
        data_bin: the fairseq-preprocess output directory.
        subword: how the data were segmented: ``"subword_nmt"`` (``@@``),
            ``"sentencepiece"`` (or the data pipeline's ``bpe``/``spm-bpe``/``spm-unigram``),
            ``"none"``; removed by fairseq-generate's --remove-bpe. None: the method
            residual-fairseq-prepare recorded in the ``manifest.json`` beside ``data_bin``;
            without one, a target dictionary full of subword marks is an error.
        detok_lang: target language for Moses detokenization, or None when the text
            was not Moses-tokenized (e.g. sentencepiece on raw text).
        compound_split: split ``a-b`` compounds before tokenized BLEU (WMT en-de).
        reference: a raw reference file for sacreBLEU (default: fairseq's T lines,
            detokenized with ``detok_lang``).
        out_json: the result file (default ``<checkpoint dir>/eval-<subset>.json`` for
            ``checkpoint_best.pt``, ``eval-<subset>-<checkpoint name>.json`` for another file,
            ``eval-<subset>-avg<N>[-updates].json`` for an average); ``.generate.txt``
            (+ ``.log``), ``.hyp.txt`` and, when averaging, ``.averaged.pt`` files are written
            beside it, under its name less a final ``.json``.
        generate_args: extra fairseq-generate arguments, e.g. ``["--max-len-b", "50"]``.
        threads: CPU threads of fairseq-generate (default: inherited environment).

    Returns the dict written to ``out_json``: checkpoint(s), data, generation options,
    command, ``sacrebleu`` (score, signature), ``chrf``, ``tokenized_bleu``,
    ``num_sentences`` and the paths of the hypotheses and generate output.
    """
    data_bin = Path(data_bin)
    check_generate_extra_args(generate_args)
    if not data_bin.is_dir():
        raise UserError(f"data directory not found: {data_bin}")
    check_split(data_bin, subset)  # present, whole and matching its dictionaries
    checkpoint_file, checkpoint_dir = pick_checkpoint(checkpoint, last_n)
    flag = "--out-json"
    if out_json is None:
        out_json = checkpoint_dir / default_result_name(subset, checkpoint_file, last_n, update_based)
        flag = "the default --out-json"
    out_json = Path(out_json)
    files = result_files(out_json, averaged=bool(last_n))
    for role, path in files.items():
        check_output_file(path, flag if role == "result" else f"{flag} {out_json}: its side file")
    # Everything is checked before anything is written or fairseq-generate runs.
    sources = averaging.last_n_checkpoints(checkpoint_dir, last_n, update_based) if last_n else [str(checkpoint_file)]
    inputs = [("a checkpoint being averaged" if last_n else "the checkpoint", path) for path in sources]
    inputs += [("the --reference file", reference)] + data_input_files(data_bin, subset)
    refuse_overwriting_inputs(files.values(), inputs, out_json, flag)
    if reference is not None and not Path(reference).is_file():
        raise UserError(f"--reference {reference}: no such file")
    subword, subword_from = resolve_subword(subword, data_bin, subset)
    detok_lang = resolve_detok_lang(detok_lang, data_bin, subset)

    # A failed run must leave an earlier result intact: its JSON names the .generate.txt (+ .log),
    # .hyp.txt and .averaged.pt beside it, so the new ones are written under temporary names and
    # moved into place together with the new JSON, only once everything has succeeded.
    staged = {role: Path(f"{files[role]}.partial-{os.getpid()}")
              for role in ("generate_output", "generate_log", "hypotheses", "averaged") if role in files}
    remove_abandoned_staging(files[role] for role in staged)
    try:
        if last_n:
            averaging.save_checkpoint_atomically(averaging.average_checkpoints(sources), staged["averaged"])
            print(f"averaged {len(sources)} checkpoints (into {files['averaged']}):\n  " + "\n  ".join(sources),
                  flush=True)
            checkpoint_path = staged["averaged"]
        else:
            checkpoint_path = verify_checkpoint_file(checkpoint_file)
        with unsplittable_path(checkpoint_path) as generate_path:
            command = generate_command(generate_path, data_bin, subset, beam, lenpen, max_tokens, batch_size,
                                       subword, cpu, user_dir, generate_args)
            try:
                run_generate(command, staged["generate_output"], threads=threads, log_path=staged["generate_log"])
            except GenerateFailed as failed:
                if staged["generate_log"].exists():
                    os.replace(staged["generate_log"], files["failed_log"])
                raise UserError(f"fairseq-generate exited {failed.returncode}: {failed.last_line} "
                                f"(full log: {files['failed_log']})") from None
        final_checkpoint = files["averaged"] if last_n else checkpoint_path
        recorded_command = [str(final_checkpoint) if word == str(generate_path) else word for word in command]
        expected = binarized_size(data_bin, subset)
        scores = score_generate_output(staged["generate_output"], detok_lang=detok_lang,
                                       compound_split=compound_split, reference=reference,
                                       hypotheses_path=staged["hypotheses"])
        if scores["num_sentences"] != expected:
            os.replace(staged["generate_output"], files["failed_output"])
            if staged["generate_log"].exists():
                os.replace(staged["generate_log"], files["failed_log"])
            raise UserError(f"fairseq-generate translated {scores['num_sentences']} of the {expected} sentences "
                            f"of '{subset}' (see {files['failed_output']})")
        scores.update(generate_output=str(files["generate_output"]), hypotheses=str(files["hypotheses"]))
        result = {
            "checkpoint": str(final_checkpoint),
            "averaged_from": sources if last_n else None,
            "averaging": ({"last_n": last_n, "update_based": bool(update_based), "directory": str(checkpoint_dir),
                           "checkpoints": sources, "averaged_checkpoint": str(files["averaged"])}
                          if last_n else None),
            "data": str(data_bin),
            "subset": subset,
            "generation": {"beam": beam, "lenpen": lenpen, "max_tokens": max_tokens, "batch_size": batch_size,
                           "subword": subword, "subword_from": subword_from, "extra_args": list(generate_args)},
            "generate_command": shlex.join(recorded_command),
            **scores,
            "generate_log": str(files["generate_log"]),
            "result_file": str(out_json),
        }
        for role, path in staged.items():
            if path.exists():  # (the log always is, unless fairseq-generate is replaced in a test)
                os.replace(path, files[role])
    finally:
        for path in staged.values():
            if path.exists():
                path.unlink()
    write_json(result, out_json)
    return result


def remove_abandoned_staging(outputs) -> None:
    """Remove what an evaluation of the same outputs left when it was killed (SIGKILL, or SIGTERM,
    which ends Python without cleanup): ``OUT.partial-PID`` and its temporaries, for a PID that
    no longer runs. Nothing else is touched."""
    for output in map(Path, outputs):
        name = re.compile(rf"\.?{re.escape(output.name)}\.partial-(\d+)(\..+\.tmp)?")
        for entry in output.parent.glob(f"*{glob.escape(output.name)}.partial-*"):
            match = name.fullmatch(entry.name)
            if match and entry.is_file() and not entry.is_symlink() and not process_alive(int(match[1])):
                with contextlib.suppress(OSError):
                    entry.unlink()


def write_json(result, path):
    with atomic_output(path) as tmp, open(tmp, "w", encoding="utf-8") as out:
        json.dump(result, out, indent=2, ensure_ascii=False)
        out.write("\n")


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


def build_parser():
    parser = argparse.ArgumentParser(
        prog="residual-fairseq-evaluate",
        description="Average checkpoints, run fairseq-generate, and score with sacreBLEU, chrF and "
                    "tokenized (compound-split) BLEU; writes a JSON result file.",
    )
    parser.add_argument("checkpoint", nargs="?", help="checkpoint file or checkpoint directory")
    parser.add_argument("data", nargs="?", help="fairseq-preprocess output directory (data-bin)")
    parser.add_argument("--subset", default="test", help="split to translate (default: test)")
    parser.add_argument("--last-n", type=positive_int,
                        help="average the last N epoch checkpoints of the directory (into <out>.averaged.pt, "
                             "beside the result file)")
    parser.add_argument("--update-based", action="store_true",
                        help="with --last-n: average checkpoint_E_U.pt (update) checkpoints instead of epochs")
    parser.add_argument("--beam", type=int_at_least(1, 1000), default=5)
    parser.add_argument("--lenpen", type=length_penalty, default=1.0)
    parser.add_argument("--max-tokens", type=positive_int, default=4096)
    parser.add_argument("--batch-size", type=positive_int)
    parser.add_argument("--subword", choices=sorted(REMOVE_BPE),
                        help="how the data were segmented (removed with fairseq-generate --remove-bpe; default: "
                             "the method in the manifest.json residual-fairseq-prepare wrote beside the data "
                             "directory; without one, a dictionary full of subword marks is an error)")
    parser.add_argument("--detok-lang", help="Moses-detokenize with this language (when the data were tokenized)")
    parser.add_argument("--compound-split", action="store_true",
                        help="split a-b compounds before tokenized BLEU (compound_split_bleu.sh, WMT en-de)")
    parser.add_argument("--reference", help="raw reference file for sacreBLEU (default: detokenized T lines)")
    parser.add_argument("--out-json",
                        help="result file; its .hyp.txt, .generate.txt(.log) and (averaging) .averaged.pt are "
                             "written beside it, under its name less a final .json (default: <checkpoint dir>/"
                             "eval-<subset>.json for checkpoint_best.pt, eval-<subset>-<checkpoint>.json for "
                             "another file, eval-<subset>-avgN[-updates].json with --last-n; language models: "
                             "eval-lm-<subset>[-<checkpoint>].json)")
    parser.add_argument("--cpu", action="store_true", default=None, help="generate on CPU (default: CPU without CUDA)")
    parser.add_argument("--generate-args", type=shell_words, default=[],
                        help="extra fairseq-generate arguments, one shell-quoted string, e.g. '--max-len-b 50'")
    lm = parser.add_argument_group("language models (a data directory with dict.txt): perplexity by fairseq-eval-lm")
    lm.add_argument("--tokens-per-sample", type=int, default=512, help="block length (fairseq's README: 512)")
    lm.add_argument("--context-window", type=int, default=400,
                    help="tokens of context kept for each scored token (fairseq's README: 400)")
    parser.add_argument("--from-generate-output", metavar="FILE",
                        help="only score an existing fairseq-generate output (no checkpoint/data needed)")
    add_threads_flag(parser)
    add_verbose_flag(parser)
    return parser


def is_language_model_data(data) -> bool:
    """fairseq's language_modeling layout: one dict.txt, no dict.<lang>.txt."""
    return (Path(data) / "dict.txt").is_file() and not any(Path(data).glob("dict.*.txt"))


# Options that only one kind of evaluation reads; given to another, they would be silently ignored.
TRANSLATION_ONLY = ("last_n", "update_based", "beam", "lenpen", "batch_size", "subword", "detok_lang",
                    "compound_split", "reference")
LANGUAGE_MODEL_ONLY = ("tokens_per_sample", "context_window")
GENERATION_ONLY = ("subset", "last_n", "update_based", "beam", "lenpen", "max_tokens", "batch_size", "subword",
                   "cpu", "generate_args", "tokens_per_sample", "context_window", "threads")


def explicit_options(argv):
    """The dests of the options given on the command line (not merely defaulted)."""
    parser = build_parser()
    for action in parser._actions:
        action.default = argparse.SUPPRESS
    return set(vars(parser.parse_args(argv)))


def refuse_options(given, dests, why: str) -> None:
    flags = {action.dest: action.option_strings[0] for action in build_parser()._actions if action.option_strings}
    named = [flags[dest] for dest in dests if dest in given]
    if named:
        raise UserError(f"{', '.join(named)} {'does' if len(named) == 1 else 'do'} not apply {why}: leave "
                        f"{'it' if len(named) == 1 else 'them'} out")


def evaluate_language_model_cli(args, threads=None):
    from .language_models import evaluate_lm

    checkpoint = Path(args.checkpoint)
    checkpoint_file = checkpoint / "checkpoint_best.pt" if checkpoint.is_dir() else checkpoint
    flag = "--out-json"
    out_json = args.out_json
    if out_json is None:
        out_json = checkpoint_file.parent / default_result_name(args.subset, checkpoint_file, kind="eval-lm")
        flag = "the default --out-json"
        check_output_file(out_json, flag)
    data_bin = Path(args.data)
    inputs = [("the checkpoint", checkpoint_file)] + (data_input_files(data_bin, args.subset) if data_bin.is_dir()
                                                      else [])
    refuse_overwriting_inputs([out_json], inputs, out_json, flag)
    result = evaluate_lm(checkpoint, args.data, subset=args.subset, tokens_per_sample=args.tokens_per_sample,
                         context_window=args.context_window, max_tokens=args.max_tokens, cpu=args.cpu,
                         extra_args=args.generate_args, out_json=out_json, threads=threads)
    print(f"{args.subset} perplexity {result['perplexity']:.2f} (loss {result['loss_base2']:.4f} bits/token, "
          f"{result['tokens']} tokens, --tokens-per-sample {args.tokens_per_sample} "
          f"--context-window {args.context_window})")
    print(f"wrote {out_json}")


@cli_main
def main(argv=None):
    args = build_parser().parse_args(argv)
    if args.out_json:
        check_output_file(args.out_json, "--out-json")
    given = explicit_options(argv)
    if args.from_generate_output:
        if args.checkpoint or args.data:
            raise UserError("--from-generate-output scores an existing output: give no checkpoint or data")
        refuse_options(given, GENERATION_ONLY, "with --from-generate-output (it only scores an existing output)")
        if args.out_json:
            refuse_overwriting_inputs([args.out_json], [("the --from-generate-output file", args.from_generate_output),
                                                        ("the --reference file", args.reference)], args.out_json)
        hypotheses, _ = read_generate_output(args.from_generate_output)
        marks = generate_output_segmentation(hypotheses)
        if marks:
            print(f"warning: the hypotheses in {args.from_generate_output} still carry {marks} subword marks: "
                  f"was fairseq-generate run without --remove-bpe {REMOVE_BPE[marks]}?", file=sys.stderr, flush=True)
        result = score_generate_output(args.from_generate_output, detok_lang=args.detok_lang,
                                       compound_split=args.compound_split, reference=args.reference)
        if args.out_json:
            result["result_file"] = args.out_json
            write_json(result, args.out_json)
    else:
        if not (args.checkpoint and args.data):
            raise UserError("give a checkpoint (file or directory) and a data directory, or --from-generate-output")
        if is_language_model_data(args.data):
            refuse_options(given, TRANSLATION_ONLY,
                           f"to language-model data ({args.data} holds one dict.txt: perplexity by fairseq-eval-lm)")
        else:
            refuse_options(given, LANGUAGE_MODEL_ONLY, f"to translation data ({args.data} holds dict.<lang>.txt files; "
                                                         f"these are fairseq-eval-lm options for language models)")
        threads, source = resolve_threads(args.threads)
        print(threads_note(threads, source), flush=True)
        if is_language_model_data(args.data):
            return evaluate_language_model_cli(args, threads)
        result = evaluate_run(
            args.checkpoint, args.data, subset=args.subset, last_n=args.last_n, update_based=args.update_based,
            beam=args.beam, lenpen=args.lenpen, max_tokens=args.max_tokens, batch_size=args.batch_size,
            subword=args.subword, detok_lang=args.detok_lang, compound_split=args.compound_split,
            reference=args.reference, out_json=args.out_json, cpu=args.cpu,
            generate_args=args.generate_args, threads=threads,
        )
    print(summary(result))
    if "result_file" in result:
        print(f"wrote {result['result_file']}")


if __name__ == "__main__":
    main()
