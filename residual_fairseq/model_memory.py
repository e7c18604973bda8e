"""How much memory training a transformer takes: the one estimate by which analyze and benchmark refuse a model.

A lower bound, from the sizes alone (the model is never built for it): fp32 weights,
their gradients and Adam's two moments (16 bytes a parameter, embeddings not counted)
and, for a batch of ``tokens`` tokens a side, the activations each layer keeps for the
backward pass (about 10 widths and 2 FFN widths a token in an encoder layer, 14 and 2
in a decoder layer, 4 bytes each; attention maps not counted). A model above it cannot
train here; one below may still not, which the run then reports.
"""
import os

from .errors import UserError


def training_bytes(encoder_layers: int, decoder_layers: int, embed: int, ffn: int, tokens: int = 0) -> int:
    """At least this many bytes to train the model one step (see the module's docstring)."""
    parameters = (encoder_layers * (4 * embed * embed + 2 * embed * ffn)
                  + decoder_layers * (8 * embed * embed + 2 * embed * ffn))
    activations = tokens * (encoder_layers * (10 * embed + 2 * ffn) + decoder_layers * (14 * embed + 2 * ffn))
    return parameters * 4 * 4 + activations * 4


def memory_bytes(device: str = "cpu"):
    """This machine's memory (``cpu``) or the GPU's (``cuda``); None when it cannot be told."""
    if device == "cuda":
        import torch

        return torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() else None
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def check_fits_memory(encoder_layers: int, decoder_layers: int, embed: int, ffn: int, tokens: int = 0,
                      device: str = "cpu") -> None:
    """UserError when :func:`training_bytes` exceeds the memory of ``device``: before anything is built
    (building it would grow until the machine runs out)."""
    needed = training_bytes(encoder_layers, decoder_layers, embed, ffn, tokens)
    memory = memory_bytes(device)
    if memory is None or needed <= memory:
        return
    batch = f" and the activations of a {tokens}-token batch" if tokens else ""
    where = "this GPU has" if device == "cuda" else "this machine has"
    raise UserError(f"a {encoder_layers}+{decoder_layers}-layer model of width {embed} needs about "
                    f"{needed / 2**30:.0f} GiB for its weights and optimizer state{batch}; {where} "
                    f"{memory / 2**30:.0f} GiB")
