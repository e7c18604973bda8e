"""fairseq-train's output: the run's log file, and what of it the console shows.

Every line fairseq-train prints goes to ``SAVE_DIR/train.log`` unchanged (fairseq's
own ``--log-file`` keeps only some loggers, not the validation stats). The console gets
a copy of rank 0's lines or, with ``--progress``, a progress bar (:class:`ProgressDisplay`).
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


def copy_output(process, log_path: Path, to_console: bool, progress: Optional[ProgressDisplay] = None):
    """Append a process's output to ``log_path`` (and echo it, or feed it to a progress bar), line by line."""
    with open(log_path, "a", encoding="utf-8") as log:
        for line in process.stdout:
            log.write(line)
            log.flush()
            if progress is not None:
                progress.feed(line)
            elif to_console:
                sys.stdout.write(line)
                sys.stdout.flush()
