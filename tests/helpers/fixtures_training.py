"""Fixtures of the training area (configs, train, reproduce, finetune tests)."""
import pytest


@pytest.fixture(scope="session")
def sample_prepared(tmp_path_factory):
    """The bundled es-en sample, prepared once (small vocabulary to keep models tiny).

    Returns the prepared directory (manifest.json, spm.model, bin/). Preparing is
    idempotent, so modules that import this fixture directly share the directory.
    """
    from residual_fairseq.data import prepare_sample_corpus

    out = tmp_path_factory.getbasetemp() / "sample-es-en-v1000"
    prepare_sample_corpus(out, vocab_size=1000)
    return out
