"""Shared pytest fixtures. Fixture modules of each area are listed in pytest_plugins."""
import pytest

from helpers import make_toy_corpus, preprocess

pytest_plugins = []


@pytest.fixture(scope="session")
def toy_data_bin(tmp_path_factory):
    """fairseq-binarized toy corpus (joined dictionary), built once per session."""
    root = tmp_path_factory.mktemp("toy")
    corpus = make_toy_corpus(root / "text")
    return preprocess(corpus, root / "bin")
