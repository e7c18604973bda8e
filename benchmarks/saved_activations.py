"""Bytes autograd keeps for backward, per variant and precision: one exact, load-independent
number behind the peak-memory column of ``residual-fairseq-benchmark speed``.

For one training batch of the sample corpus, each variant's forward pass runs under
``torch.autograd.graph.saved_tensors_hooks`` and the distinct storages it saves are summed
(a tensor saved by two operations counts once). Three precisions:

- fp32;
- autocast bf16 (what fairseq's ``--amp`` does; fp16 on CUDA saves the same shapes);
- pure bf16 weights (what fairseq's ``--fp16``/``--bf16`` do, in the dtype the CPU has).

    PYTHONPATH=<checkout> python3 benchmarks/saved_activations.py DATA_BIN [--preset iwslt_de_en --layers 6]
"""
import argparse
from contextlib import nullcontext

import torch

from residual_fairseq.benchmark.data import draw_batches, load_task
from residual_fairseq.benchmark.training import build_variant
from residual_fairseq.variants import VARIANTS


def saved_mib(model, batch, autocast_dtype=None) -> float:
    storages = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    context = torch.autocast("cpu", dtype=autocast_dtype) if autocast_dtype else nullcontext()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor), context:
        model(**batch["net_input"])
    return sum(storages.values()) / 2**20


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("data")
    parser.add_argument("--preset", default="iwslt_de_en")
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--max-tokens", type=int, default=1024)
    args = parser.parse_args()
    task = load_task(args.data, None, None)
    batch = draw_batches(task, "train", 1, max_tokens=args.max_tokens, seed=1)[0]
    print(f"{args.preset} {args.layers}+{args.layers} layers, one batch of {batch['ntokens']} target tokens; "
          "MiB saved for backward (x post_ln)")
    print(f"{'variant':10} {'fp32':>16} {'autocast bf16':>16} {'pure bf16':>16}")
    baseline = None
    for variant in VARIANTS:
        row = []
        for precision in ("fp32", "autocast", "pure"):
            torch.manual_seed(1)
            model = build_variant(task, variant, args.preset, encoder_layers=args.layers,
                                  decoder_layers=args.layers).train()
            if precision == "pure":
                model = model.to(torch.bfloat16)
            row.append(saved_mib(model, batch, torch.bfloat16 if precision == "autocast" else None))
        baseline = baseline or row
        print(f"{variant:10} " + " ".join(f"{mib:7.1f} ({mib / base:.3f})" for mib, base in zip(row, baseline)))


if __name__ == "__main__":
    main()
