"""One evaluation of a translation checkpoint: checks, (averaging,) fairseq-generate, scores, staged commit."""
import os
import shlex
from pathlib import Path
from typing import Optional, Sequence

from .. import USER_DIR
from .. import average_checkpoints as averaging
from ..argtypes import check_output_file
from ..data.binarized import check_split
from ..errors import UserError
from ..run_inputs import data_input_files, refuse_overwriting_inputs, unsplittable_path
from ..checkpoints import read_checkpoint
from .choice import check_translation_checkpoint, pick_checkpoint
from .generate import (GenerateFailed, binarized_size, check_generate_extra_args, generate_command,
                       resolve_detok_lang, resolve_subword, run_generate, score_generate_output)
from .staging import default_result_name, remove_abandoned_staging, result_files, write_json


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
            averaged = averaging.average_checkpoints(sources)
            check_translation_checkpoint(averaged, sources[0])
            averaging.save_checkpoint_atomically(averaged, staged["averaged"])
            print(f"averaged {len(sources)} checkpoints (into {files['averaged']}):\n  " + "\n  ".join(sources),
                  flush=True)
            checkpoint_path = staged["averaged"]
        else:
            check_translation_checkpoint(read_checkpoint(checkpoint_file), checkpoint_file)  # verified, too
            checkpoint_path = Path(checkpoint_file)
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
