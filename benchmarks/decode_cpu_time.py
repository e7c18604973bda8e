#!/usr/bin/env python3
"""Beam-search decoding cost of ResiDual vs Post-LN, in process CPU time, in one process.

For a shared, loaded machine, where wall-clock throughput (``residual-fairseq-benchmark
speed``) swings by tens of percent: the variants decode the same random batches
(beam 5, output as long as the source, untrained models), interleaved and in rotating
order, each repeat timed with ``time.process_time()`` on one thread. Prints the median
and spread of the per-repeat ratio (ResiDual sentences per CPU second / Post-LN's).

Run it against two checkouts to compare implementations, e.g. before and after a change:

    PYTHONPATH=/path/to/checkout python3 benchmarks/decode_cpu_time.py --repeats 7
"""
import argparse
import statistics
import time

import torch

import residual_fairseq
from fairseq.sequence_generator import SequenceGenerator
from residual_fairseq.variants import build_model, toy_dictionary


def batches(vocab_size, pad, n_batches, batch_size, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n_batches):
        lengths = torch.randint(8, 30, (batch_size,), generator=g)
        src = torch.full((batch_size, int(lengths.max())), pad)
        for row, length in enumerate(lengths.tolist()):
            src[row, -length:] = torch.randint(4, vocab_size, (length,), generator=g)  # left-padded, as fairseq
        out.append({"net_input": {"src_tokens": src, "src_lengths": lengths}})
    return out


def decode_cpu_seconds(generator, model, samples):
    start = time.process_time()
    with torch.inference_mode():
        for sample in samples:
            generator.generate([model], sample)
    return time.process_time() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", default="iwslt_de_en,wmt_en_de")
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--batches", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=8)
    args = parser.parse_args()
    torch.set_num_threads(1)
    vocab = toy_dictionary(8000)
    samples = batches(len(vocab), vocab.pad(), args.batches, args.batch_size)
    print(f"residual_fairseq from {residual_fairseq.__file__}")
    for preset in args.presets.split(","):
        models = {}
        for variant in ("post_ln", "resi_dual"):
            torch.manual_seed(0)
            models[variant] = build_model(variant, preset, src_dict=vocab, encoder_layers=args.layers,
                                          decoder_layers=args.layers).eval()
        generators = {v: SequenceGenerator([m], vocab, beam_size=5, match_source_len=True) for v, m in models.items()}
        for v in models:  # warm-up, not timed
            decode_cpu_seconds(generators[v], models[v], samples[:1])
        ratios, seconds = [], {v: [] for v in models}
        for repeat in range(args.repeats):
            order = list(models) if repeat % 2 == 0 else list(reversed(models))
            for v in order:
                seconds[v].append(decode_cpu_seconds(generators[v], models[v], samples))
            ratios.append(seconds["post_ln"][-1] / seconds["resi_dual"][-1])
        print(f"{preset} L{args.layers}: decode CPU s post_ln {statistics.median(seconds['post_ln']):.2f}, "
              f"resi_dual {statistics.median(seconds['resi_dual']):.2f}; speed ratio resi_dual/post_ln "
              f"median {statistics.median(ratios):.3f} [{min(ratios):.3f}-{max(ratios):.3f}] over {args.repeats}")


if __name__ == "__main__":
    main()
