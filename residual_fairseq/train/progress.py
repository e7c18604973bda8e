"""fairseq-train's output: the run's log file, and what of it the console shows.

Every line fairseq-train prints goes to ``SAVE_DIR/train.log`` unchanged (fairseq's
own ``--log-file`` keeps only some loggers, not the validation stats). The console gets
a copy of rank 0's lines, less the known harmless warnings torch prints from inside
fairseq on every run (:data:`KNOWN_WARNINGS`), or, with ``--progress``, a progress bar
(:class:`ProgressDisplay`).
"""
import json
import re
import sys
from pathlib import Path
from typing import Optional

LOG_NAME = "train.log"

_STATS_LINE = re.compile(r"\| (train_inner|train|valid) \| (\{.*\})\s*$")
_BATCHES_LINE = re.compile(r"grouped total_num_itrs = (\d+)")
_ERROR_LINE = re.compile(r"^(\S+: )?error: ")  # argparse's and the plugin's one-line errors
_LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \| (\w+) \|")


class ProgressDisplay:
    """A tqdm bar (updates, loss, ETA) fed with fairseq's JSON log lines, for a terminal.

    The full output still goes to train.log; on the terminal, INFO records (the config,
    the model) and Python's deprecation warnings give way to the bar, validation and
    epoch results are printed as one line each, and fairseq's WARNING/ERROR records and
    any traceback are shown as they come.
    """

    def __init__(self, max_update=0, max_epoch=0, stream=None):
        from tqdm import tqdm

        self.max_update, self.max_epoch = max_update or 0, max_epoch or 0
        self.stream = stream or sys.stdout
        self.bar = tqdm(total=self.max_update or None, unit="upd", dynamic_ncols=True, file=self.stream,
                        desc="training")
        self._showing = False        # inside a WARNING/ERROR record (its continuation lines too)
        self._in_traceback = False   # from "Traceback" on, everything is shown

    def feed(self, line: str) -> None:
        stats = _STATS_LINE.search(line)
        if stats:
            kind, values = stats.group(1), json.loads(stats.group(2))
            if kind == "train_inner":
                self.bar.update(max(0, int(float(values.get("num_updates", self.bar.n))) - self.bar.n))
                self.bar.set_postfix(epoch=values.get("epoch"), loss=values.get("loss"), lr=values.get("lr"))
            elif kind == "valid":
                shown = {key[len("valid_"):]: values[key] for key in ("valid_loss", "valid_bleu", "valid_best_loss",
                                                                        "valid_best_bleu") if key in values}
                self.write(f"epoch {values.get('epoch')} update {values.get('valid_num_updates')}: valid "
                           + ", ".join(f"{key} {value}" for key, value in shown.items()))
            else:
                self.write(f"epoch {values.get('epoch')} done: train loss {values.get('train_loss')}, "
                           f"{values.get('train_wps')} words/s")
            return
        batches = _BATCHES_LINE.search(line)
        if batches:
            if not self.max_update and self.max_epoch:
                self.bar.total = int(batches.group(1)) * self.max_epoch
                self.bar.refresh()
            return
        level = _LOG_LINE.match(line)
        if level:  # a new log record: shown when it is a warning or an error
            self._showing = level.group(1) in ("WARNING", "ERROR", "CRITICAL")
        elif line.startswith("Traceback"):
            self._showing = self._in_traceback = True
        if (self._showing or self._in_traceback or _ERROR_LINE.match(line)) and line.strip():
            self.write(line.rstrip("\n"))

    def write(self, text: str) -> None:
        """A line above the bar."""
        self.bar.write(text, file=self.stream)

    def close(self):
        self.bar.close()


class KnownWarning:
    """A warning Python prints as ``FILE:LINE: CATEGORY: MESSAGE`` and then ``  SOURCE LINE``,
    known by its exact message, the file that warns (a path suffix) and its source line."""

    def __init__(self, category: str, message: str, where: str, source: str):
        self.header = re.compile(rf"^(?P<file>.+):\d+: {re.escape(category)}: {re.escape(message)}$")
        self.where, self.source = where, source

    def starts(self, line: str) -> bool:
        match = self.header.match(line.rstrip("\r\n"))
        return bool(match) and match["file"].replace("\\", "/").endswith(self.where)

    def continues(self, line: str) -> bool:
        return line.rstrip("\r\n") == "  " + self.source


# Printed by every fairseq 0.12 training under torch 2.x, from inside fairseq; nothing a
# user can change (train.log keeps them). Each is matched by its exact message and the
# source line Python prints after it, never by category or module alone.
KNOWN_WARNINGS = (
    # fairseq's train_step (fairseq/tasks/fairseq_task.py) uses the old autocast spelling
    KnownWarning("FutureWarning", "`torch.cuda.amp.autocast(args...)` is deprecated. Please use "
                 "`torch.amp.autocast('cuda', args...)` instead.", "fairseq/tasks/fairseq_task.py",
                 "with torch.cuda.amp.autocast(enabled=(isinstance(optimizer, AMPOptimizer))):"),
    # fairseq's MultiheadAttention hands torch a bool padding mask beside a float attention mask
    KnownWarning("UserWarning", "Support for mismatched key_padding_mask and attn_mask is deprecated. "
                 "Use same type for both instead.", "torch/nn/functional.py",
                 "key_padding_mask = _canonical_mask("),
)


class ConsoleFilter:
    """Which of fairseq-train's lines the console shows: all but the :data:`KNOWN_WARNINGS`
    (their message line and, when it follows, their source line)."""

    def __init__(self, known=KNOWN_WARNINGS):
        self.known = known
        self._after = None  # the known warning whose message line came last

    def shows(self, line: str) -> bool:
        after, self._after = self._after, None
        if after is not None and after.continues(line):
            return False
        for warning in self.known:
            if warning.starts(line):
                self._after = warning
                return False
        return True


def copy_output(process, log_path: Path, to_console: bool, progress: Optional[ProgressDisplay] = None):
    """Append a process's output to ``log_path`` (and echo it, or feed it to a progress bar), line by line.

    The log gets every line; the console (or the bar) all but the known warnings (:class:`ConsoleFilter`).
    """
    console = ConsoleFilter()
    with open(log_path, "a", encoding="utf-8") as log:
        for line in process.stdout:
            log.write(line)
            log.flush()
            if not (to_console or progress is not None) or not console.shows(line):
                continue
            if progress is not None:
                progress.feed(line)
            else:
                sys.stdout.write(line)
                sys.stdout.flush()
