"""Training throughput, peak training memory and beam-search speed, variant by variant.

Every measurement (one variant at one size, one repeat) runs in a fresh child process
on the same saved batches, so no variant inherits another's allocator state, caches
or warm-up. Repeats interleave the variants, in a rotated order, so slow drift of a
shared machine spreads over all of them instead of biasing one.
"""
import logging
import statistics
import time
from argparse import Namespace
from concurrent.futures import ProcessPoolExecutor
import os
import tempfile
from dataclasses import dataclass
from multiprocessing import get_context

import torch

from ..errors import UserError
from ..fairseq_data import is_language_modeling
from ..variants import VARIANTS
from .data import draw_batches, first_sentences, load_task
from .memory import CPU_CHILD_ENV, PeakMemory
from .quiet import hide_known_warnings
from .training import Trainer, autocast, build_variant, check_precision, resolve_device, to_device

BASELINE = "post_ln"
# ResiDual against Post-LN: (metric, comparison, bound). Reported, never asserted in tests.
TARGETS = (
    ("train_tokens_per_s", ">=", 0.97),
    ("decode_sentences_per_s", ">=", 0.97),
    ("peak_memory_mib", "<=", 1.05),
)
METRICS = ("train_tokens_per_s", "peak_memory_mib", "decode_sentences_per_s")


@dataclass
class Job:
    """One measurement: everything a child process needs, as plain values."""

    variant: str
    preset: str
    layers: int
    repeat: int
    data: str
    source_lang: str
    target_lang: str
    batches_file: str
    warmup: int
    device: str
    precision: str
    threads: int
    beam: int
    seed: int


def measure(job: Job) -> dict:
    """Train on the saved batches, then beam-decode; runs inside the child process."""
    logging.getLogger().setLevel(logging.WARNING)  # importing fairseq turned on DEBUG
    hide_known_warnings()  # a fresh (spawned) process: the parent's filters do not reach it
    torch.set_num_threads(job.threads)
    torch.manual_seed(job.seed)
    device = torch.device(job.device)
    task = load_task(job.data, job.source_lang, job.target_lang)
    saved = torch.load(job.batches_file, weights_only=True)
    train = [to_device(b, device) for b in saved["train"]]
    decode = [to_device(b, device) for b in saved["decode"]]

    memory = PeakMemory(device)
    memory.start()  # the peak counts the model, its gradients, Adam's state and activations
    model = build_variant(task, job.variant, job.preset,
                          encoder_layers=job.layers, decoder_layers=job.layers).to(device)
    trainer = Trainer(task, model, device, job.precision)
    for batch in train[: job.warmup]:
        trainer.step(batch)
    timed = train[job.warmup:]
    with Stopwatch(device) as train_time:
        losses = [trainer.step(batch) for batch in timed]
    train_seconds = train_time.seconds
    peak_mib = memory.peak_mib()

    decode_seconds, sentences = _beam_decode(task, model, decode, job, device)
    return {
        **{k: getattr(job, k) for k in ("variant", "preset", "layers", "repeat")},
        "malloc_mmap_threshold": os.environ.get("MALLOC_MMAP_THRESHOLD_"),
        "parameters": sum(p.numel() for p in model.parameters()),
        "train_tokens_per_s": sum(b["ntokens"] for b in timed) / train_seconds,
        "train_seconds": train_seconds,
        "train_wall_seconds": train_time.wall_seconds,
        "timer": train_time.method,
        "last_loss": losses[-1],
        "peak_memory_mib": peak_mib,
        "memory_method": memory.method,
        "decode_sentences_per_s": sentences / decode_seconds,
        "decode_sentences": sentences,
        "decode_seconds": decode_seconds,
    }


def _beam_decode(task, model, batches, job, device):
    """fairseq's SequenceGenerator, beam ``job.beam``, output as long as the source.

    The models are barely trained, so left alone they would stop at random lengths and
    the variants would decode different numbers of steps; ``match_source_len`` makes
    every variant decode exactly as many steps, close to real translation lengths.
    """
    model.eval()
    if is_language_modeling(task):
        generator, batches = _language_model_generation(task, model, batches, job.beam)
    else:
        generator = task.build_generator([model], Namespace(beam=job.beam, match_source_len=True))
    with torch.inference_mode(), autocast(device, job.precision):
        task.inference_step(generator, [model], batches[0])  # warm-up, not timed
        sentences = 0
        with Stopwatch(device) as decode_time:
            for batch in batches:
                hypotheses = task.inference_step(generator, [model], batch)
                sentences += len(hypotheses)
    return decode_time.seconds, sentences


def _language_model_generation(task, model, batches, beam):
    """Language models generate from an empty prompt exactly half a test block's length of
    tokens, then </s> (min_len, max_len), so every variant decodes the same number of steps."""
    steps = batches[0]["net_input"]["src_tokens"].size(1) // 2
    generator = task.build_generator([model], Namespace(beam=beam, min_len=steps, max_len_a=0,
                                                        max_len_b=steps + 1))
    eos = task.source_dictionary.eos()
    prompts = []
    for batch in batches:
        tokens = batch["net_input"]["src_tokens"]
        empty = tokens.new_full((tokens.size(0), 1), eos)  # the task strips this leading eos
        prompts.append({**batch, "net_input": {"src_tokens": empty, "src_lengths": empty.new_ones(tokens.size(0))}})
    return generator, prompts


class Stopwatch:
    """The time of the block it wraps: on CUDA by CUDA events recorded on the device's stream
    before and after it (the device's own clock: host-side jitter and the Python start of the
    block do not count), elsewhere by ``time.perf_counter``; ``wall_seconds`` is the host's
    time from start to the device being done, for comparison. On CUDA the events still count
    the device's idle gaps between kernels: a launch-bound setting shows as tokens/s that grow
    with the batch (benchmarks/cuda_throughput.sh checks this), not as a gap between the two."""

    def __init__(self, device):
        self.device = device
        self.method = "cuda events" if device.type == "cuda" else "perf_counter"

    def __enter__(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self._events = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
            self._events[0].record()
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc):
        if self.device.type == "cuda":
            self._events[1].record()
            torch.cuda.synchronize(self.device)
        self.wall_seconds = time.perf_counter() - self._start
        self.seconds = (self._events[0].elapsed_time(self._events[1]) / 1000.0 if self.device.type == "cuda"
                        else self.wall_seconds)
        return False


def run_isolated(job: Job) -> dict:
    """``measure(job)`` in a new process (spawned, so nothing is shared with this one)."""
    env = CPU_CHILD_ENV if job.device == "cpu" else {}
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)  # a spawned process starts with this process's environment
    try:
        with ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn")) as pool:
            return pool.submit(measure, job).result()
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def schedule(configs, variants, repeats):
    """(repeat, preset, layers, variant) in run order: variants rotate from repeat to repeat."""
    for repeat in range(repeats):
        shift = repeat % len(variants)
        order = variants[shift:] + variants[:shift]
        for preset, layers in configs:
            for variant in order:
                yield repeat, preset, layers, variant


def summarize(results, variants):
    """Median and spread per metric, and per-repeat paired ratios against Post-LN.

    A ratio is taken within a repeat (ResiDual's run and Post-LN's run of the same
    repeat, close in time) and then summarised by its median over repeats.
    """
    rows = []
    configs = sorted({(r["preset"], r["layers"]) for r in results}, key=lambda c: (c[0], c[1]))
    for preset, layers in configs:
        of_config = [r for r in results if (r["preset"], r["layers"]) == (preset, layers)]
        baseline = {r["repeat"]: r for r in of_config if r["variant"] == BASELINE}
        for variant in variants:
            runs = sorted((r for r in of_config if r["variant"] == variant), key=lambda r: r["repeat"])
            row = {"preset": preset, "layers": layers, "variant": variant,
                   "repeats": len(runs), "parameters": runs[0]["parameters"]}
            for metric in METRICS:
                values = [r[metric] for r in runs]
                row[metric] = _spread(values)
                if baseline:
                    ratios = [r[metric] / baseline[r["repeat"]][metric] for r in runs
                              if r["repeat"] in baseline and baseline[r["repeat"]][metric] > 0]
                    row[metric + "_ratio"] = _spread(ratios) if ratios else None
            rows.append(row)
    return rows


def _spread(values):
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "values": values}


def check_targets(rows):
    """PASS/FAIL of ResiDual against Post-LN for every measured size."""
    checks = []
    for row in rows:
        if row["variant"] != "resi_dual":
            continue
        for metric, comparison, bound in TARGETS:
            ratio = row.get(metric + "_ratio")
            if ratio is None:
                continue
            value = ratio["median"]
            passed = value >= bound if comparison == ">=" else value <= bound
            checks.append({"preset": row["preset"], "layers": row["layers"], "metric": metric,
                           "ratio": value, "comparison": comparison, "bound": bound,
                           "passed": passed})
    return checks


def run_speed_benchmark(data, configs, variants=VARIANTS, repeats=3, warmup=2, updates=5,
                        max_tokens=2048, decode_sentences=64, decode_batch_size=16, beam=5,
                        device="auto", precision="fp32", threads=None, seed=1,
                        source_lang=None, target_lang=None, progress=print) -> dict:
    """Measure every variant at every (preset, layers) in ``configs``; returns the report.

    The report holds the settings, every single measurement (``runs``), the summary
    rows with medians, spreads and ratios against Post-LN, and the target checks.
    """
    variants = list(variants)
    if repeats < 1 or updates < 1 or warmup < 1:
        raise UserError("--repeats, --updates and --warmup must be at least 1")
    device = resolve_device(device)
    check_precision(precision, device)
    threads = threads or torch.get_num_threads()
    task = load_task(data, source_lang, target_lang)
    train = draw_batches(task, "train", warmup + updates, max_tokens=max_tokens, seed=seed)
    decode = first_sentences(
        draw_batches(task, "test", None, max_sentences=decode_batch_size, shuffle=False),
        decode_sentences,
    )
    settings = {
        "data": str(data), "source_lang": getattr(task.cfg, "source_lang", None),
        "target_lang": getattr(task.cfg, "target_lang", None),
        "configs": [list(c) for c in configs], "variants": variants, "repeats": repeats,
        "warmup": warmup, "updates": updates, "max_tokens": max_tokens,
        "decode_sentences": sum(b["nsentences"] for b in decode),
        "decode_batch_size": decode_batch_size, "beam": beam, "device": str(device),
        "precision": precision, "threads": threads, "seed": seed,
        "train_target_tokens": sum(b["ntokens"] for b in train[warmup:]),
    }
    results = []
    with tempfile.TemporaryDirectory(prefix="residual-benchmark-") as tmp:
        batches_file = os.path.join(tmp, "batches.pt")
        torch.save({"train": train, "decode": decode}, batches_file)
        plan = list(schedule(configs, variants, repeats))
        for number, (repeat, preset, layers, variant) in enumerate(plan, 1):
            job = Job(variant, preset, layers, repeat, str(data), settings["source_lang"],
                      settings["target_lang"], batches_file, warmup, str(device), precision,
                      threads, beam, seed)
            result = run_isolated(job)
            results.append(result)
            progress(
                f"[{number}/{len(plan)}] repeat {repeat + 1} {preset} L{layers} {variant}: "
                f"train {result['train_tokens_per_s']:.0f} tok/s, "
                f"peak {result['peak_memory_mib']:.1f} MiB, "
                f"decode {result['decode_sentences_per_s']:.2f} sent/s"
            )
    rows = summarize(results, variants)
    return {"settings": settings, "runs": results, "rows": rows, "targets": check_targets(rows)}
