"""Shared pytest fixtures. Fixture modules of each area, and the slow marker's rules, are listed in pytest_plugins."""
import pytest

from helpers import make_toy_corpus, preprocess

pytest_plugins = ["helpers.fixtures_training", "helpers.slow_marker"]


@pytest.fixture(scope="session")
def toy_data_bin(tmp_path_factory):
    """fairseq-binarized toy corpus (joined dictionary), built once per session."""
    root = tmp_path_factory.mktemp("toy")
    corpus = make_toy_corpus(root / "text")
    return preprocess(corpus, root / "bin")


@pytest.fixture(scope="session")
def trained_tiny(tmp_path_factory, toy_data_bin):
    """A resi_dual_tiny model trained by the real fairseq-train CLI for 300 updates.

    Returns (data_bin, save_dir, training log). Trained with non-default dual-stream
    scales, so tests can see that CLI options reach the model.
    """
    from helpers import TINY_TRAIN_ARGS, USER_DIR, fairseq_cli, run

    save_dir = tmp_path_factory.mktemp("tiny_ckpt")
    proc = run([
        fairseq_cli("fairseq-train"), toy_data_bin, "--user-dir", USER_DIR, *TINY_TRAIN_ARGS,
        "--dual-scale-encoder", "0.5", "--dual-scale-decoder", "0.25",
        "--max-tokens", "400", "--max-update", "300", "--save-dir", save_dir,
    ])
    return toy_data_bin, save_dir, proc.stdout + proc.stderr
