"""Tables (plain text and markdown) and the JSON record of a benchmark run."""
import datetime
import json
import os
import platform
import sys

import torch

from ..atomic import write_text_atomically
from .speed import METRICS, BASELINE

METRIC_HEADERS = {
    "train_tokens_per_s": "train tok/s",
    "peak_memory_mib": "peak train MiB",
    "decode_sentences_per_s": "decode sent/s",
}


def environment(argv) -> dict:
    import fairseq

    env = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["residual-fairseq-benchmark", *argv]),
        "python": platform.python_version(), "torch": torch.__version__,
        "fairseq": getattr(fairseq, "__version__", "?"), "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
    }
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name()
    return env


def number(value) -> str:
    if value != value:  # NaN
        return "nan"
    if abs(value) >= 1000:
        return f"{value:.0f}"
    return f"{value:.1f}" if abs(value) >= 10 else f"{value:.3g}"


def with_range(spread, digits=None) -> str:
    fmt = (lambda v: f"{v:.{digits}f}") if digits is not None else number
    return f"{fmt(spread['median'])} [{fmt(spread['min'])}-{fmt(spread['max'])}]"


def table(headers, rows, markdown=False) -> str:
    if markdown:
        lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
        return "\n".join(lines)
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in rows]
    return "\n".join(lines)


def speed_report(report, markdown=False) -> str:
    s = report["settings"]
    headers = ["preset", "layers", "variant", "params"]
    for metric in METRICS:
        headers += [METRIC_HEADERS[metric], f"x {BASELINE}"]
    rows = []
    for row in report["rows"]:
        cells = [row["preset"], str(row["layers"]), row["variant"], f"{row['parameters'] / 1e6:.1f}M"]
        for metric in METRICS:
            ratio = row.get(metric + "_ratio")
            cells += [with_range(row[metric]), with_range(ratio, 3) if ratio else "-"]
        rows.append(cells)
    intro = (
        f"Speed and memory: {s['device']} {s['precision']}, {s['threads']} threads; "
        f"median [min-max] over {s['repeats']} interleaved repeats, each variant in a fresh process. "
        f"Training: {s['updates']} timed updates after {s['warmup']} warm-up "
        f"({s['train_target_tokens']} target tokens, max_tokens {s['max_tokens']}, "
        f"label_smoothed_cross_entropy + Adam). Peak memory: growth during training "
        f"(model, gradients, Adam state, activations). Decoding: beam {s['beam']}, "
        f"{s['decode_sentences']} test sentences in batches of {s['decode_batch_size']}, "
        f"output length = source length. Ratios are per repeat against {BASELINE}."
    )
    targets = [
        f"{'PASS' if t['passed'] else 'FAIL'}  {t['preset']} L{t['layers']} resi_dual "
        f"{METRIC_HEADERS[t['metric']]}: {t['ratio']:.3f}x {t['comparison']} {t['bound']}"
        for t in report["targets"]
    ]
    bullet = "- " if markdown else "  "
    return "\n\n".join([
        intro, table(headers, rows, markdown),
        "Targets (ResiDual vs Post-LN, median ratio):\n" + "\n".join(bullet + t for t in targets),
    ])


def depth_report(report, markdown=False) -> str:
    from .depth import summarize_seeds

    s = report["settings"]
    seeds = s.get("seeds", [s.get("seed")])  # records written before --seeds hold one "seed"
    headers = ["layers", "variant", "start loss", "final train loss", "valid loss", "diverged"]
    rows = [[str(r["layers"]), r["variant"], f"{r['start_loss']:.3f}", f"{r['final_loss']:.3f}",
             f"{r['valid_loss']:.3f}", "yes" if r["diverged"] else "no"] for r in report["rows"]]
    if len(seeds) > 1:
        headers.insert(0, "seed")
        rows = [[str(r["seed"])] + row for r, row in zip(report["rows"], rows)]
    intro = (
        f"Depth stability: width {s['width']} (ffn {s['ffn']}, {s['heads']} heads), "
        f"{s['updates']} updates of max_tokens {s['max_tokens']}, Adam lr {s['lr']} with "
        + (f"inverse_sqrt after {s['warmup_updates']} warm-up updates, " if s.get("warmup", True) else
           f"no warm-up (the peak rate for the first {s['warmup_updates']} updates, then inverse_sqrt decay), ")
        + f"seed{'s' if len(seeds) > 1 else ''} "
        f"{', '.join(str(seed) for seed in seeds)}, {s['device']} {s['precision']}. Losses in bits/token "
        f"(label-smoothed, as fairseq logs); final = mean of the last tenth of updates; valid on "
        f"{s['valid_batches']} batches. Diverged = NaN/inf or final loss not below the start."
    )
    text = intro + "\n\n" + table(headers, rows, markdown)
    if len(seeds) > 1:
        summary = [[str(r["layers"]), r["variant"],
                    f"{r['valid_loss_mean']:.3f} ± {r['valid_loss_std']:.3f}", f"{r['diverged']}/{r['seeds']}"]
                   for r in summarize_seeds(report["rows"])]
        text += ("\n\nOver the seeds (mean ± sample std):\n\n"
                 + table(["layers", "variant", "valid loss", "diverged"], summary, markdown))
    return text


def write_outputs(report, render, json_path=None, markdown_path=None):
    if json_path:
        write_text_atomically(json_path, json.dumps(report, indent=2, allow_nan=True) + "\n")
    if markdown_path:
        env = report["environment"]
        header = f"`{env['command']}` ({env['date']}, torch {env['torch']}, {env['platform']})\n\n"
        write_text_atomically(markdown_path, header + render(report, markdown=True) + "\n")


def echo(message):
    print(message, file=sys.stderr, flush=True)
