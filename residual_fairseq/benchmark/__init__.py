"""``residual-fairseq-benchmark``: what ResiDual costs against stock fairseq, and what depth buys.

Two benchmarks over one fairseq-preprocess data directory:

- ``speed``: training throughput, peak training memory and beam-search decoding
  speed of Post-LN, Pre-LN and ResiDual at identical sizes, with ratios against
  Post-LN and PASS/FAIL against the performance targets;
- ``depth``: narrow models at growing depth trained for the same budget; final
  and valid loss, and whether training diverged.

Python API: :func:`~.speed.run_speed_benchmark`, :func:`~.depth.run_depth_benchmark`.
"""
import argparse
from pathlib import Path

from ..argtypes import (MAX_SEED, check_output_file, int_at_least, is_digits, nonnegative_int, positive_float,
                        positive_int, refuse_repeats, same_file)
from ..configs import MAX_LAYERS
from ..errors import UserError, cli_main
from ..model_memory import check_fits_memory
from ..runtime import MAX_THREADS, add_verbose_flag
from ..variants import LM_VARIANTS, VARIANTS, arch_name

DEFAULT_SIZES = "iwslt_de_en:6,wmt_en_de:6,iwslt_de_en:12"
DEFAULT_LM_SIZES = "gpt2_tiny:6,gpt2_tiny:24"  # used when --data is language-model data


def parse_sizes(text, language_model=False):
    """``"iwslt_de_en:6,wmt_en_de:12"`` -> ``[("iwslt_de_en", 6), ("wmt_en_de", 12)]``.

    Language models: fairseq's transformer_lm preset suffixes, e.g. ``gpt2_tiny:6`` (the
    size of ``transformer_lm_gpt2_tiny`` at 6 layers, as Post-LN, Pre-LN and ResiDual).
    """
    from fairseq.models import ARCH_MODEL_REGISTRY

    if language_model:
        text = DEFAULT_LM_SIZES if text == DEFAULT_SIZES else text

    sizes = []
    for item in filter(None, text.split(",")):
        preset, _, layers = item.partition(":")
        if not is_digits(layers) or not 1 <= int(layers) <= MAX_LAYERS:
            raise UserError(f"--sizes {item!r}: expected PRESET:LAYERS, e.g. iwslt_de_en:6")
        if language_model:
            if preset and f"transformer_lm_{preset}" not in ARCH_MODEL_REGISTRY:
                raise UserError(f"--sizes {item!r}: no architecture transformer_lm_{preset}")
            sizes.append((preset, int(layers)))
            continue
        for variant in VARIANTS:
            if arch_name(variant, preset) not in ARCH_MODEL_REGISTRY:
                raise UserError(f"--sizes {item!r}: no architecture {arch_name(variant, preset)}")
        sizes.append((preset, int(layers)))
    if not sizes:
        raise UserError("--sizes is empty")
    refuse_repeats([f"{preset}:{layers}" for preset, layers in sizes], "--sizes", text)
    return sizes


def parse_variants(text, language_model=False):
    """``--variants`` (None: every variant the models come in; language models: LM_VARIANTS)."""
    allowed = LM_VARIANTS if language_model else VARIANTS
    if text is None:
        return list(allowed)
    variants = [v for v in text.split(",") if v]
    unknown = [v for v in variants if v not in allowed]
    if unknown or not variants:
        kind = "language models: " if language_model else ""
        raise UserError(f"--variants {text!r}: choose from {kind}{', '.join(allowed)}")
    refuse_repeats(variants, "--variants", text)
    return variants


def parse_depths(text):
    try:
        depths = [int(d) for d in text.split(",") if d]
    except ValueError:
        depths = []
    if not depths or min(depths) < 1 or max(depths) > MAX_LAYERS:
        raise UserError(f"--depths {text!r}: expected positive integers up to {MAX_LAYERS}, e.g. 6,12,24")
    refuse_repeats(depths, "--depths", text)
    return depths


def parse_seeds(text):
    """``--seeds 1,2,3`` -> [1, 2, 3]; None stays None (then --seed)."""
    if text is None:
        return None
    items = [item.strip() for item in text.split(",") if item.strip()]
    if not items or not all(is_digits(item) and int(item) <= MAX_SEED for item in items):
        raise UserError(f"--seeds {text!r}: expected distinct integers from 0 to {MAX_SEED}, e.g. 1,2,3")
    seeds = [int(item) for item in items]
    refuse_repeats(seeds, "--seeds", text)
    return seeds


def model_dimensions(preset: str, layers: int, language_model: bool = False):
    """(encoder layers, decoder layers, width, FFN width) of a ``--sizes`` entry, from fairseq's
    preset (nothing is built)."""
    if language_model:
        from .training import lm_preset_sizes

        sizes = lm_preset_sizes(preset)
        return 0, layers, sizes.get("decoder_embed_dim", 512), sizes.get("decoder_ffn_embed_dim", 2048)
    from fairseq.models import ARCH_CONFIG_REGISTRY

    args = argparse.Namespace(encoder_layers=layers, decoder_layers=layers)
    ARCH_CONFIG_REGISTRY[arch_name("post_ln", preset)](args)
    return (layers, layers, max(args.encoder_embed_dim, args.decoder_embed_dim),
            max(args.encoder_ffn_embed_dim, args.decoder_ffn_embed_dim))


def check_models_fit(models, max_tokens: int, device: str, precision: str) -> None:
    """Refuse, before anything is built, a model (``(encoder layers, decoder layers, width, ffn)``)
    whose training step cannot fit the device's memory (:mod:`residual_fairseq.model_memory`):
    building it would grow until the machine runs out."""
    from .training import resolve_device

    device = resolve_device(device).type
    tokens = max_tokens if precision == "fp32" else max_tokens // 2  # 16-bit activations take half
    for encoder_layers, decoder_layers, width, ffn in models:
        check_fits_memory(encoder_layers, decoder_layers, width, ffn, tokens, device)


def check_outputs(data, json_path=None, markdown_path=None) -> None:
    """Refuse --json/--markdown paths that cannot be written, that would overwrite the data
    the benchmark reads (a file in --data, or one linked to it), or that name one file:
    the markdown would replace the JSON record."""
    outputs = [(flag, Path(path)) for path, flag in ((json_path, "--json"), (markdown_path, "--markdown")) if path]
    for flag, path in outputs:
        check_output_file(path, flag)
    if len(outputs) == 2 and same_file(outputs[0][1], outputs[1][1]):
        raise UserError(f"--json {json_path} and --markdown {markdown_path} are one file: give two file names")
    data = Path(data)
    try:
        data_files = [entry for entry in data.iterdir() if entry.is_file()] if data.is_dir() else []
    except OSError:  # unreadable: loading the data says so
        data_files = []
    try:
        data_dir = data.resolve()
    except (OSError, RuntimeError):  # a symlink loop: loading the data says so
        data_dir = None
    for flag, path in outputs:
        try:  # resolved: "DATA/../x.json" is not in DATA, "link-to-DATA/x.json" is
            inside = data_dir is not None and data_dir in path.resolve().parents
        except (OSError, RuntimeError):
            inside = False
        linked = next((entry for entry in data_files if same_file(path, entry)), None)
        if inside or linked is not None:
            where = f"is in --data {data}" if inside else f"would overwrite {linked} of --data"
            raise UserError(f"{flag} {path} {where}: write it outside the data directory")


def build_parser():
    parser = argparse.ArgumentParser(prog="residual-fairseq-benchmark", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)

    def common(sub):
        sub.add_argument("--data", required=True, help="fairseq-preprocess output directory")
        sub.add_argument("--source-lang", default=None)
        sub.add_argument("--target-lang", default=None)
        sub.add_argument("--variants", default=None,
                         help=f"comma-separated (default: all, {','.join(VARIANTS)}; language models: "
                              f"{','.join(LM_VARIANTS)})")
        sub.add_argument("--max-tokens", type=positive_int, default=2048, help="tokens per training batch")
        sub.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
        sub.add_argument("--precision", default="fp32", choices=("fp32", "fp16", "bf16"),
                         help="fp16/bf16: torch.autocast mixed precision (fp16 on CUDA only)")
        sub.add_argument("--threads", type=int_at_least(1, MAX_THREADS), default=None, help="torch CPU threads")
        sub.add_argument("--seed", type=int_at_least(0, MAX_SEED), default=1)
        sub.add_argument("--json", default=None, help="write the full record (every run) here")
        sub.add_argument("--markdown", default=None, help="write the table as markdown here")
        add_verbose_flag(sub)

    speed = commands.add_parser("speed", help="throughput and memory, side by side")
    common(speed)
    speed.add_argument("--sizes", default=DEFAULT_SIZES,
                       help=f"PRESET:LAYERS list (encoder and decoder layers); default {DEFAULT_SIZES}")
    speed.add_argument("--repeats", type=positive_int, default=3)
    speed.add_argument("--warmup", type=nonnegative_int, default=2, help="untimed updates first")
    speed.add_argument("--updates", type=positive_int, default=5, help="timed updates")
    speed.add_argument("--beam", type=int_at_least(1, 1000), default=5)
    speed.add_argument("--decode-sentences", type=positive_int, default=64)
    speed.add_argument("--decode-batch-size", type=positive_int, default=16)

    depth = commands.add_parser("depth", help="depth stability at a fixed training budget")
    common(depth)
    depth.add_argument("--depths", default="6,12,24", help="encoder and decoder layers, e.g. 6,12,24,48")
    depth.add_argument("--width", type=positive_int, default=64, help="embedding dim (ffn 4x, 4 heads)")
    depth.add_argument("--updates", type=positive_int, default=300)
    depth.add_argument("--lr", type=positive_float, default=1e-3)
    depth.add_argument("--warmup-updates", type=positive_int, default=100,
                       help="updates of linear warm-up to the peak --lr, then inverse_sqrt decay (default 100)")
    depth.add_argument("--no-warmup", action="store_true",
                       help="the paper's warm-up ablation: the peak --lr from the first update for "
                            "--warmup-updates updates, then the same decay (as residual-fairseq-reproduce --no-warmup)")
    depth.add_argument("--valid-batches", type=positive_int, default=20)
    depth.add_argument("--log-interval", type=nonnegative_int, default=0,
                       help="also print each run's training loss every N updates (default 0: only its result)")
    depth.add_argument("--seeds", default=None,
                       help="comma-separated seeds, each a full run of every depth and variant, with a "
                            "mean ± std table (default: --seed)")
    return parser


@cli_main
def main(argv=None):
    import sys

    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    check_outputs(args.data, args.json, args.markdown)
    if args.command == "depth" and args.width % 4:
        raise UserError(f"--width {args.width} must be divisible by the 4 attention heads")
    # Imported after parsing, so that bad options fail before the runs set anything up.
    from .quiet import quiet_known_noise

    with quiet_known_noise(args.verbose):
        return run_benchmark(args, argv)


def run_benchmark(args, argv) -> int:
    """The benchmark ``args`` ask for: run, print its table, write its files."""
    from .data import is_language_model_data
    from .report import depth_report, echo, environment, speed_report, write_outputs

    started = environment(argv)  # its date is when the run began
    language_model = is_language_model_data(args.data)
    common = dict(
        variants=parse_variants(args.variants, language_model), max_tokens=args.max_tokens, device=args.device,
        precision=args.precision, threads=args.threads, seed=args.seed,
        source_lang=args.source_lang, target_lang=args.target_lang, progress=echo,
    )
    if args.command == "speed":
        from .speed import run_speed_benchmark

        sizes = parse_sizes(args.sizes, language_model)
        check_models_fit([model_dimensions(preset, layers, language_model) for preset, layers in sizes],
                         args.max_tokens, args.device, args.precision)
        report = run_speed_benchmark(
            args.data, sizes, repeats=args.repeats, warmup=args.warmup,
            updates=args.updates, beam=args.beam, decode_sentences=args.decode_sentences,
            decode_batch_size=args.decode_batch_size, **common,
        )
        render = speed_report
    else:
        from .depth import run_depth_benchmark

        depths = parse_depths(args.depths)
        check_models_fit([(0 if language_model else depth, depth, args.width, 4 * args.width) for depth in depths],
                         args.max_tokens, args.device, args.precision)
        report = run_depth_benchmark(
            args.data, depths, width=args.width, updates=args.updates,
            lr=args.lr, warmup_updates=args.warmup_updates, valid_batches=args.valid_batches,
            seeds=parse_seeds(args.seeds), log_interval=args.log_interval, warmup=not args.no_warmup, **common,
        )
        render = depth_report
    report["environment"] = started
    print(render(report))
    write_outputs(report, render, args.json, args.markdown)
    return 0
