"""residual-fairseq-evaluate: score a translation checkpoint, a language model's perplexity, or an existing output."""
import argparse
import sys
from pathlib import Path

from ..argtypes import check_output_file, int_at_least, length_penalty, positive_int, shell_words
from ..errors import UserError, cli_main
from ..fairseq_data import is_language_model_data
from ..run_inputs import data_input_files, refuse_overwriting_inputs
from ..runtime import add_threads_flag, add_verbose_flag, resolve_threads, threads_note
from .generate import REMOVE_BPE, generate_output_segmentation, read_generate_output, score_generate_output, summary
from .staging import default_result_name, write_json
from .translation import evaluate_run


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
    from ..language_models import evaluate_lm

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
