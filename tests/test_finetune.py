"""Fine-tuning on a new pair: the sample es->en model continues on en->es with its vocabulary."""
from pathlib import Path

import pytest

from helpers import CLI_ENV, REPO, run
from residual_fairseq import finetune, train

FAIRSEQ_FLAGS = ["--max-tokens", "1024", "--max-valid-steps", "1", "--no-epoch-checkpoints",
                 "--eval-bleu-args", '{"beam": 1, "max_len_a": 0, "max_len_b": 6}']


@pytest.fixture(scope="module")
def es_en_checkpoint(sample_prepared, tmp_path_factory):  # noqa: F811
    save_dir = tmp_path_factory.mktemp("es-en")
    train.train(train.TrainRequest("sample-es-en", "resi_dual", 3, sample_prepared / "bin", save_dir,
                                   extra_args=["--max-update", "2", *FAIRSEQ_FLAGS]))
    return save_dir / "checkpoint_last.pt"


def test_finetune_en_es_from_es_en(es_en_checkpoint, sample_prepared, tmp_path):  # noqa: F811
    data_out, save_dir = tmp_path / "en-es", tmp_path / "ft"
    proc = run(["python3", REPO / "scripts" / "finetune.py", "--checkpoint", es_en_checkpoint,
                "--dataset", "sample-es-en", "--source-lang", "en", "--target-lang", "es",
                "--data-out", data_out, "--save-dir", save_dir, "--", "--max-update", "2", *FAIRSEQ_FLAGS],
               env=CLI_ENV)
    assert "--finetune-from-model" in proc.stdout and "--source-lang en --target-lang es" in proc.stdout
    # Binarized with the original model's dictionaries (and its sentencepiece model).
    for lang in ("en", "es"):
        assert (data_out / "bin" / f"dict.{lang}.txt").read_text() == \
            (sample_prepared / "bin" / f"dict.{lang}.txt").read_text()
    assert (data_out / "bin" / "train.en-es.en.bin").is_file()
    log = (save_dir / "train.log").read_text()
    assert "loading pretrained model from" in log and '"valid_num_updates": "2"' in log
    assert (save_dir / "checkpoint_last.pt").is_file()


def test_incompatible_vocabulary_is_one_line(es_en_checkpoint, tmp_path):
    small = tmp_path / "dict.txt"
    small.write_text("".join(f"w{i} 1\n" for i in range(10)))
    with pytest.raises(finetune.VocabularyMismatch, match="vocabularies incompatible: .* embeddings but"):
        finetune.check_compatible(es_en_checkpoint, small, small)
    vocabulary = finetune.OriginalVocabulary(tmp_path, None, {"es": small, "en": tmp_path / "other.txt"})
    (tmp_path / "other.txt").write_text("x 1\n")
    with pytest.raises(finetune.VocabularyMismatch, match="none for 'fr'"):
        vocabulary.dictionary_for("fr")


@pytest.mark.parametrize("content, problem", [
    ("garbage", "cannot be read (JSONDecodeError)"),
    ("[1]", "is not a JSON object"),
    ('{"dataset": "sample-es-en"}', "has no 'variant' string"),
    ('{"dataset": "sample-es-en", "variant": "post_ln", "layers": 2, "data": null}', "has no 'data' string"),
    ('{"dataset": "sample-es-en", "variant": "post_ln", "layers": "2", "data": "d/bin"}', "has no 'layers' from 1 to 1000"),
    ('{"dataset": "sample-es-en", "variant": "post_ln", "layers": 2, "decoder_layers": true, "data": "d/bin"}',
     "has no 'decoder_layers' from 1 to 1000"),
])
def test_a_run_record_beside_a_handed_over_checkpoint_is_checked(tmp_path, content, problem):
    """run.json comes with the checkpoint: one this tool did not write is one line (it was a
    KeyError/TypeError traceback), and it is not read when the flags replace it."""
    (tmp_path / "run.json").write_text(content)
    request = finetune.FinetuneRequest(tmp_path / "checkpoint_best.pt", "sample-es-en", "en", "es",
                                       tmp_path / "new", tmp_path / "save")
    with pytest.raises(finetune.UserError) as refused:
        finetune.original_run(request)
    assert str(refused.value) == (f"{tmp_path / 'run.json'} {problem}: it is not a run record residual-fairseq-train "
                                  "wrote; pass --train-config DATASET VARIANT LAYERS and --vocab-from "
                                  "ORIGINAL_PREPARED_DIR instead")
    request.config, request.vocab_from = ("sample-es-en", "post_ln", 2, 2), tmp_path / "prepared"
    assert finetune.original_run(request) == (("sample-es-en", "post_ln", 2, 2), tmp_path / "prepared")


def test_a_run_record_this_tool_wrote_names_the_original_run(tmp_path):
    (tmp_path / "run.json").write_text('{"dataset": "sample-es-en", "variant": "b2t", "layers": 6, '
                                       '"decoder_layers": 3, "data": "/x/prepared/bin"}')
    request = finetune.FinetuneRequest(tmp_path / "checkpoint_best.pt", "sample-es-en", "en", "es",
                                       tmp_path / "new", tmp_path / "save")
    assert finetune.original_run(request) == (("sample-es-en", "b2t", 6, 3), Path("/x/prepared"))
