"""Small shared helpers for the tests: a generated toy corpus and CLI runners."""
import os
import random
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
USER_DIR = str(REPO / "residual_fairseq")

# Keep fairseq's CLIs quiet and single-threaded enough for 2-core CI machines.
CLI_ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}


def make_toy_corpus(directory, n_train=600, n_valid=40, n_test=40, seed=0):
    """A learnable toy translation task: reverse the words and change their alphabet.

    Writes {train,valid,test}.{src,tgt}; returns the directory.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(30)]
    for split, n in (("train", n_train), ("valid", n_valid), ("test", n_test)):
        with open(directory / f"{split}.src", "w") as src, open(directory / f"{split}.tgt", "w") as tgt:
            for _ in range(n):
                sent = [rng.choice(words) for _ in range(rng.randint(3, 8))]
                src.write(" ".join(sent) + "\n")
                tgt.write(" ".join(w.upper() for w in reversed(sent)) + "\n")
    return directory


def run(cmd, cwd=None, check=True, timeout=600, env=None):
    """Run a command; on failure show its output in the assertion message."""
    proc = subprocess.run(
        [str(c) for c in cmd], cwd=cwd, env=env or CLI_ENV, capture_output=True, text=True, timeout=timeout
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"{cmd[0]} exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    return proc


def fairseq_cli(name):
    """The path of a fairseq console script installed beside this Python."""
    return str(Path(sys.executable).with_name(name))


def preprocess(corpus_dir, dest):
    """Binarize a toy corpus with fairseq-preprocess, in this process (tests that do not
    start processes can use it); leaves fairseq's logging as it found it."""
    import logging

    from fairseq import options
    from fairseq_cli import preprocess as fairseq_preprocess

    args = options.get_preprocessing_parser().parse_args([
        "--source-lang", "src", "--target-lang", "tgt",
        "--trainpref", f"{corpus_dir}/train", "--validpref", f"{corpus_dir}/valid",
        "--testpref", f"{corpus_dir}/test", "--destdir", str(dest), "--joined-dictionary", "--workers", "1",
    ])
    root, fairseq_logger = logging.getLogger(), logging.getLogger("fairseq_cli.preprocess")
    level, handlers = root.level, list(fairseq_logger.handlers)
    try:
        fairseq_preprocess.main(args)
    finally:  # fairseq sets the root level and adds a log file handler it never removes
        root.setLevel(level)
        for handler in fairseq_logger.handlers[len(handlers):]:
            fairseq_logger.removeHandler(handler)
            handler.close()
    return Path(dest)


TINY_TRAIN_ARGS = [
    "--arch", "resi_dual_tiny", "--share-all-embeddings",
    "--optimizer", "adam", "--lr", "3e-3", "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "20",
    "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
    "--max-tokens", "1200", "--num-workers", "0", "--cpu", "--seed", "1",
    "--no-progress-bar", "--log-format", "simple", "--log-interval", "5",
]


# Log lines a CLI may print before its error (fairseq's, Python logging's, the drivers' notes).
LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\d |(INFO|DEBUG|WARNING):|note: )")


def user_error(capsys, main, argv, only_line=False):
    """Run a project CLI in-process that must refuse: exit 2, no traceback, its last line
    (with ``only_line``, its one line besides log lines) an error; returns that line."""
    import pytest

    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        main([str(a) for a in argv])
    err = capsys.readouterr().err
    assert exited.value.code == 2, err[-2000:]
    assert "Traceback" not in err, err[-3000:]
    lines = [line for line in err.splitlines() if line.strip() and not LOG_LINE.match(line)]
    assert lines and re.match(r"^(\S+( \S+)?: )?error: ", lines[-1]), lines
    assert len(lines) == 1 or not only_line, err[-3000:]
    return lines[-1]


def markdown_rows(text, header_start):
    """The rows of the one markdown table whose header line starts with ``header_start``, as lists
    of cells (surrounding bold dropped); fails unless exactly one line starts so."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith(header_start)]
    assert len(starts) == 1, f"{len(starts)} tables headed {header_start!r}, not one"
    rows = []
    for line in lines[starts[0] + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip().strip("*") for cell in line.strip("|").split("|")])
    return rows
