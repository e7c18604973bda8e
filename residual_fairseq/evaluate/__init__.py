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

The package, by concept: :mod:`.choice` (which checkpoint), :mod:`.generate`
(fairseq-generate and the scores of its output), :mod:`.staging` (the output files and
their staged commit), :mod:`.translation` (one evaluation, :func:`evaluate_run`),
:mod:`.cli` (``residual-fairseq-evaluate``).
"""
from ..errors import UserError
from ..run_inputs import data_input_files, refuse_overwriting_inputs, unsplittable_path
from .choice import pick_checkpoint, resolve_checkpoint
from .cli import build_parser, is_language_model_data, main
from .generate import (GENERATE_OWN_FLAGS, REMOVE_BPE, GenerateFailed, binarized_size, check_generate_extra_args,
                       detokenize, generate_command, generate_output_segmentation, prepare_manifest_of, read_generate_output,
                       read_lines, remove_bpe_value, resolve_detok_lang, resolve_subword, run_generate,
                       score_generate_output, summary)
from .staging import default_result_name, remove_abandoned_staging, result_files, result_stem, write_json
from .translation import evaluate_run

__all__ = [
    "GENERATE_OWN_FLAGS", "REMOVE_BPE", "GenerateFailed", "UserError", "binarized_size", "build_parser",
    "check_generate_extra_args", "data_input_files", "default_result_name", "detokenize", "evaluate_run",
    "generate_command", "generate_output_segmentation", "is_language_model_data", "main", "pick_checkpoint",
    "prepare_manifest_of", "read_generate_output", "read_lines", "refuse_overwriting_inputs",
    "remove_abandoned_staging", "remove_bpe_value", "resolve_checkpoint", "resolve_detok_lang", "resolve_subword",
    "result_files", "result_stem", "run_generate", "score_generate_output", "summary", "unsplittable_path",
    "write_json",
]
