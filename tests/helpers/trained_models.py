"""Tiny trained models shared by test_evaluate.py and test_translate.py.

Plain cached builders rather than pytest fixtures, so that both test modules reuse
one training run per session without a conftest entry. They write under the
session's pytest temporary directory, which pytest cleans up.
"""
import functools
import gzip
from pathlib import Path

from helpers import TINY_TRAIN_ARGS, USER_DIR, fairseq_cli, run
from residual_fairseq.resources import shipped_dir

# Enough epochs for non-trivial (if poor) translations of varied lengths; generation
# is capped so an untrained model's endless repetitions stay cheap.
TOY_EPOCHS = 12
MAX_LEN_B = 12
AVERAGE_LAST = 3


def train_tiny(data_bin, save_dir, epochs, extra=()):
    run([fairseq_cli("fairseq-train"), data_bin, "--user-dir", USER_DIR, *TINY_TRAIN_ARGS,
         "--max-epoch", epochs, "--save-dir", save_dir, *extra])
    return Path(save_dir)


@functools.lru_cache(maxsize=None)
def toy_evaluation(data_bin):
    """A tiny resi_dual trained on the toy corpus and evaluated with the last
    AVERAGE_LAST epoch checkpoints averaged; returns (save_dir, evaluate_run result)."""
    from residual_fairseq.evaluate import evaluate_run

    save_dir = train_tiny(data_bin, Path(data_bin).parent / "evaluation", TOY_EPOCHS)
    result = evaluate_run(save_dir, data_bin, last_n=AVERAGE_LAST, beam=5,
                          generate_args=["--max-len-b", str(MAX_LEN_B)], out_json=save_dir / "eval" / "test.json")
    return save_dir, result


@functools.lru_cache(maxsize=None)
def sample_corpus_subset(session_tmp, n_train=1000, n_test=30, vocab_size=600):
    """A slice of the bundled es-en sample prepared by residual_fairseq.data (raw text,
    sentencepiece BPE): real punctuation and casing for the subword round trip."""
    from residual_fairseq.data import PrepareOptions, prepare

    root = Path(session_tmp) / "sample-slice"
    root.mkdir()
    for split, n in (("train", n_train), ("valid", n_test), ("test", n_test)):
        with gzip.open(shipped_dir("sample-es-en") / f"{split}.tsv.gz", "rt", encoding="utf-8") as tsv:
            lines = [next(tsv) for _ in range(n)]
        (root / f"{split}.tsv").write_text("".join(lines), encoding="utf-8")
    prepared = prepare(PrepareOptions(
        dataset="custom", out=root / "prepared", source_lang="es", target_lang="en", tsv_columns=(1, 2),
        train=[root / "train.tsv"], valid=[root / "valid.tsv"], test=[root / "test.tsv"],
        subword="spm-bpe", vocab_size=vocab_size, length_ratio=0, progress=False,
    ))
    save_dir = train_tiny(prepared.bin_dir, root / "ckpt", 2, ["--no-epoch-checkpoints"])
    return prepared.out_dir, save_dir
