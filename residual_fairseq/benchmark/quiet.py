"""What the benchmark keeps off its output: fairseq's INFO lines and two known torch deprecation warnings, nothing else.

fairseq logs every dictionary and split it loads at INFO, between the benchmark's own
rows; and torch warns, from inside fairseq's code, on every run:

- ``torch.cuda.amp.autocast(args...)`` is deprecated (fairseq 0.12 calls the old name);
- Support for mismatched key_padding_mask and attn_mask is deprecated (fairseq passes a
  bool padding mask with a float causal mask to torch's attention).

A user can act on neither. Exactly these are filtered, by message and category, and only
while the benchmark runs; every other warning, and fairseq's WARNING and ERROR lines,
still show. ``--verbose`` keeps fairseq's INFO lines.
"""
import contextlib
import logging
import warnings

KNOWN_WARNINGS = (
    (r"`torch\.cuda\.amp\.autocast\(args\.\.\.\)` is deprecated", FutureWarning),
    (r"Support for mismatched key_padding_mask and attn_mask is deprecated", UserWarning),
)


def hide_known_warnings() -> None:
    """Add the filters of :data:`KNOWN_WARNINGS` (for a process that only benchmarks: a measuring child)."""
    for message, category in KNOWN_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)


@contextlib.contextmanager
def quiet_known_noise(verbose: bool = False):
    """While the benchmark runs: the known warnings hidden and fairseq's loggers at WARNING (unless ``verbose``)."""
    fairseq_logger = logging.getLogger("fairseq")
    level = fairseq_logger.level
    with warnings.catch_warnings():
        hide_known_warnings()
        if not verbose:
            fairseq_logger.setLevel(logging.WARNING)
        try:
            yield
        finally:
            fairseq_logger.setLevel(level)
