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
   detokenized hypotheses ``<out>.hyp.txt`` and the raw ``<out>.generate.txt``.

Python::

    from residual_fairseq.evaluate import evaluate_run
    result = evaluate_run("checkpoints/", "data-bin/", last_n=5, subword="sentencepiece")
    print(result["sacrebleu"]["score"], result["sacrebleu"]["signature"])

CLI::

    residual-fairseq-evaluate checkpoints/ data-bin/ --last-n 5 --subword sentencepiece
"""
import argparse
import contextlib
import json
import os
import re
import shlex
import subprocess
import tempfile
from pathlib import Path
from typing import Optional, Sequence

from . import USER_DIR
from .argtypes import check_output_file, finite_float, int_at_least, positive_int, read_user_lines, shell_words
from .atomic import atomic_output
from .average_checkpoints import average_last_checkpoints
from .data.binarized import check_split
from .errors import UserError, cli_main
from .runtime import (
    add_threads_flag, add_verbose_flag, fairseq_executable, resolve_threads, thread_environment, threads_note,
)
from .safe_checkpoints import verify_checkpoint_file
from .scoring import score_translations

# fairseq-generate's --remove-bpe value for each way the data may be segmented; the
# data pipeline's method names (bpe, spm-bpe, spm-unigram) are accepted too.
REMOVE_BPE = {
    "subword_nmt": "subword_nmt", "bpe": "subword_nmt",
    "sentencepiece": "sentencepiece", "spm": "sentencepiece", "spm-bpe": "sentencepiece",
    "spm-unigram": "sentencepiece",
    "none": None,
}

_GENERATE_LINE = re.compile(r"^([HT])-(\d+)\t(.*)$")


def resolve_checkpoint(checkpoint, last_n: Optional[int] = None, update_based: bool = False,
                       averaged_path=None):
    """The checkpoint file to evaluate and the files it was made from.

    ``checkpoint`` is a file, or a directory: its ``checkpoint_best.pt``, or with
    ``last_n`` the average of its last N epoch (or update) checkpoints, written to
    ``averaged_path`` (default ``<dir>/checkpoint.avg_last<N>[_updates].pt``).
    """
    checkpoint = Path(checkpoint)
    if checkpoint.is_file():
        if last_n:
            raise UserError(f"averaging the last {last_n} checkpoints needs a checkpoint directory, got a file: {checkpoint}")
        return verify_checkpoint_file(checkpoint), [str(checkpoint)]
    if not checkpoint.is_dir():
        raise UserError(f"checkpoint not found: {checkpoint}")
    if not last_n:
        best = checkpoint / "checkpoint_best.pt"
        if not best.is_file():
            raise UserError(f"no checkpoint_best.pt in {checkpoint}: give a checkpoint file or --last-n N")
        return verify_checkpoint_file(best), [str(best)]
    if last_n < 1:
        raise UserError(f"--last-n must be at least 1, got {last_n}")
    suffix = "_updates" if update_based else ""
    averaged_path = Path(averaged_path or checkpoint / f"checkpoint.avg_last{last_n}{suffix}.pt")
    sources = average_last_checkpoints(checkpoint, last_n, averaged_path, update_based)
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



def generate_command(checkpoint, data_bin, subset="test", beam=5, lenpen=1.0, max_tokens=4096,
                     batch_size=None, subword=None, cpu=None, user_dir=USER_DIR,
                     extra_args: Sequence[str] = ()):
    """The fairseq-generate command line of one evaluation, as a list."""
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


def run_generate(command, output_path, threads=None, log_path=None):
    """Run fairseq-generate, its stdout into ``output_path`` (atomically), its log beside it."""
    print("running: " + shlex.join(command), flush=True)
    log_path = Path(log_path or str(output_path) + ".log")
    env = thread_environment(threads) if threads else None
    with atomic_output(output_path) as tmp, open(tmp, "w") as stdout, open(log_path, "w") as log:
        try:
            returncode = subprocess.run(command, stdout=stdout, stderr=log, env=env).returncode
        except FileNotFoundError:
            raise UserError(f"{command[0]} not found: is fairseq installed in this environment?")
        if returncode != 0:
            log.flush()
            raise UserError(f"fairseq-generate exited {returncode}: {_last_line(log_path)} (full log: {log_path})")


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
            ``"sentencepiece"``, or None; removed by fairseq-generate's --remove-bpe.
        detok_lang: target language for Moses detokenization, or None when the text
            was not Moses-tokenized (e.g. sentencepiece on raw text).
        compound_split: split ``a-b`` compounds before tokenized BLEU (WMT en-de).
        reference: a raw reference file for sacreBLEU (default: fairseq's T lines,
            detokenized with ``detok_lang``).
        out_json: the result file (default ``<checkpoint dir>/eval-<subset>[-avgN].json``);
            ``.generate.txt`` and ``.hyp.txt`` files are written beside it.
        generate_args: extra fairseq-generate arguments, e.g. ``["--max-len-b", "50"]``.
        threads: CPU threads of fairseq-generate (default: inherited environment).

    Returns the dict written to ``out_json``: checkpoint(s), data, generation options,
    command, ``sacrebleu`` (score, signature), ``chrf``, ``tokenized_bleu``,
    ``num_sentences`` and the paths of the hypotheses and generate output.
    """
    data_bin = Path(data_bin)
    if not data_bin.is_dir():
        raise UserError(f"data directory not found: {data_bin}")
    check_split(data_bin, subset)  # present, whole and matching its dictionaries
    if out_json is not None:  # before averaging writes anything
        check_output_file(out_json, "--out-json")
    checkpoint_path, sources = resolve_checkpoint(checkpoint, last_n, update_based)
    if out_json is None:
        tag = f"-avg{last_n}" if last_n else ""
        out_json = checkpoint_path.parent / f"eval-{subset}{tag}.json"
    out_json = Path(out_json)
    stem = out_json.with_suffix("")
    generate_output = Path(f"{stem}.generate.txt")

    for path in (out_json, generate_output, Path(f"{stem}.hyp.txt")):
        check_output_file(path, "--out-json" if path == out_json else "output")
    # A failed run must leave an earlier result intact: its JSON names the .generate.txt and
    # .hyp.txt beside it, so the new ones are written under temporary names and moved into
    # place together with the new JSON, only once everything has succeeded.
    staged_generate = Path(f"{stem}.generate.txt.partial-{os.getpid()}")
    staged_hypotheses = Path(f"{stem}.hyp.txt.partial-{os.getpid()}")
    failed_generate = Path(f"{stem}.generate.failed.txt")
    try:
        with unsplittable_path(checkpoint_path) as generate_path:
            command = generate_command(generate_path, data_bin, subset, beam, lenpen, max_tokens, batch_size,
                                       subword, cpu, user_dir, generate_args)
            run_generate(command, staged_generate, threads=threads, log_path=Path(f"{generate_output}.log"))
        expected = binarized_size(data_bin, subset)
        scores = score_generate_output(staged_generate, detok_lang=detok_lang, compound_split=compound_split,
                                       reference=reference, hypotheses_path=staged_hypotheses)
        if scores["num_sentences"] != expected:
            os.replace(staged_generate, failed_generate)
            raise UserError(f"fairseq-generate translated {scores['num_sentences']} of the {expected} sentences "
                            f"of '{subset}' (see {failed_generate})")
        scores.update(generate_output=str(generate_output), hypotheses=str(Path(f"{stem}.hyp.txt")))
        result = {
            "checkpoint": str(checkpoint_path),
            "averaged_from": sources if last_n else None,
            "data": str(data_bin),
            "subset": subset,
            "generation": {"beam": beam, "lenpen": lenpen, "max_tokens": max_tokens, "batch_size": batch_size,
                           "subword": subword, "extra_args": list(generate_args)},
            "generate_command": shlex.join(command),
            **scores,
            "result_file": str(out_json),
        }
        os.replace(staged_generate, generate_output)
        os.replace(staged_hypotheses, Path(f"{stem}.hyp.txt"))
    finally:
        for staged in (staged_generate, staged_hypotheses):
            if staged.exists():
                staged.unlink()
    write_json(result, out_json)
    return result


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
    parser.add_argument("--last-n", type=positive_int, help="average the last N epoch checkpoints of the directory")
    parser.add_argument("--update-based", action="store_true",
                        help="with --last-n: average checkpoint_E_U.pt (update) checkpoints instead of epochs")
    parser.add_argument("--beam", type=int_at_least(1, 1000), default=5)
    parser.add_argument("--lenpen", type=finite_float, default=1.0)
    parser.add_argument("--max-tokens", type=positive_int, default=4096)
    parser.add_argument("--batch-size", type=positive_int)
    parser.add_argument("--subword", choices=sorted(REMOVE_BPE),
                        help="how the data were segmented (removed with fairseq-generate --remove-bpe)")
    parser.add_argument("--detok-lang", help="Moses-detokenize with this language (when the data were tokenized)")
    parser.add_argument("--compound-split", action="store_true",
                        help="split a-b compounds before tokenized BLEU (compound_split_bleu.sh, WMT en-de)")
    parser.add_argument("--reference", help="raw reference file for sacreBLEU (default: detokenized T lines)")
    parser.add_argument("--out-json", help="result file (default: <checkpoint dir>/eval-<subset>[-avgN].json)")
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


def evaluate_language_model_cli(args, threads=None):
    from .language_models import evaluate_lm

    checkpoint = Path(args.checkpoint)
    checkpoint_dir = checkpoint if checkpoint.is_dir() else checkpoint.parent
    out_json = args.out_json or checkpoint_dir / f"eval-lm-{args.subset}.json"
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
    if args.from_generate_output:
        if args.checkpoint or args.data:
            raise UserError("--from-generate-output scores an existing output: give no checkpoint or data")
        result = score_generate_output(args.from_generate_output, detok_lang=args.detok_lang,
                                       compound_split=args.compound_split, reference=args.reference)
        if args.out_json:
            result["result_file"] = args.out_json
            write_json(result, args.out_json)
    else:
        if not (args.checkpoint and args.data):
            raise UserError("give a checkpoint (file or directory) and a data directory, or --from-generate-output")
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
