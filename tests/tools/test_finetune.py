"""Fine-tuning on a new pair: the sample es->en model continues on en->es with its vocabulary."""
import json
import shutil
from pathlib import Path

import pytest

from helpers import CLI_ENV, REPO, run, user_error
from residual_fairseq import finetune, train

FAIRSEQ_FLAGS = ["--max-tokens", "1024", "--max-valid-steps", "1", "--no-epoch-checkpoints",
                 "--eval-bleu-args", '{"beam": 1, "max_len_a": 0, "max_len_b": 6}']


@pytest.fixture(scope="module")
def es_en_checkpoint(sample_prepared, tmp_path_factory):  # noqa: F811
    save_dir = tmp_path_factory.mktemp("es-en")
    train.train(train.TrainRequest("sample-es-en", "resi_dual", 3, sample_prepared / "bin", save_dir,
                                   extra_args=["--max-update", "2", *FAIRSEQ_FLAGS]))
    return save_dir / "checkpoint_last.pt"


def test_finetune_en_es_from_es_en(capsys, es_en_checkpoint, sample_prepared, tmp_path):  # noqa: F811
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

    # The same fine-tune again resumes its own save dir (its run.json records this checkpoint and data) ...
    argv = ["--checkpoint", es_en_checkpoint, "--dataset", "sample-es-en", "-s", "en", "-t", "es",
            "--data-out", data_out, "--save-dir", save_dir, "--dry-run", "--", *FAIRSEQ_FLAGS]
    finetune.main([str(a) for a in argv])
    assert f"fairseq will resume from {save_dir / 'checkpoint_last.pt'}" in capsys.readouterr().out
    # ... but not into other data, nor from another copy of the model: fairseq would resume this run instead.
    copy = shutil.copy(es_en_checkpoint, tmp_path / "checkpoint_best.pt")
    for checkpoint, changed in ((es_en_checkpoint, ["--data-out", tmp_path / "other"]),
                                (copy, ["--checkpoint", copy])):
        line = user_error(capsys, finetune.main, argv[:-len(FAIRSEQ_FLAGS) - 1] + changed, only_line=True)
        assert line == (f"error: --save-dir {save_dir} holds checkpoints of another run (checkpoint_best.pt and "
                        f"1 more; its run.json records no fine-tune of {checkpoint} into this --data-out): fairseq "
                        f"would resume that run from checkpoint_last.pt instead of fine-tuning {checkpoint}; "
                        "choose an empty --save-dir")
    assert not (tmp_path / "other").exists()


def test_data_out_holding_another_preparation_names_finetunes_flags(capsys, es_en_checkpoint, sample_prepared,
                                                                   tmp_path):
    """prepare's advice (--out, --force) is worded with finetune's flags: it has --data-out and no --force."""
    other = tmp_path / "other"
    other.mkdir()
    shutil.copy(sample_prepared / "manifest.json", other)  # es->en, not the en->es being asked for
    line = user_error(capsys, finetune.main, [
        "--checkpoint", es_en_checkpoint, "--dataset", "sample-es-en", "-s", "en", "-t", "es",
        "--data-out", other, "--save-dir", tmp_path / "ft", "--dry-run"])
    assert line == (f"error: output directory {other} holds a different preparation (sample-es-en, other settings): "
                    "choose another --data-out (finetune does not replace an existing directory)")
    assert sorted(p.name for p in other.iterdir()) == ["manifest.json"]


def fake_run(directory, *checkpoints, record=None):
    """A save dir holding (stand-in) checkpoint files and, if given, a run.json."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in checkpoints:
        (directory / name).write_bytes(f"weights of {directory.name}/{name}".encode())
    if record is not None:
        (directory / "run.json").write_text(json.dumps(record))
    return directory


def finetune_record(checkpoint, data_out):
    """What residual-fairseq-train writes in run.json for a fine-tune (the fields the check reads)."""
    return {"dataset": "sample-es-en", "variant": "resi_dual", "layers": 3,
            "data": str(Path(data_out).resolve() / "bin"),
            "extra_args": ["--finetune-from-model", str(Path(checkpoint).resolve()), "--max-epoch", "1"]}


@pytest.mark.parametrize("case", ["own directory (the review's repro)", "own directory, no checkpoint_last.pt",
                                  "holds the model as a link", "another training run", "checkpoints, no run.json",
                                  "fine-tune of another model", "fine-tune into other data"])
def test_a_save_dir_where_fairseq_would_not_fine_tune_is_refused(capsys, tmp_path, case):
    """fairseq ignores --finetune-from-model when SAVE_DIR/checkpoint_last.pt exists (it resumes that run)
    and writes checkpoint_best.pt over what is there: such a --save-dir is one line, exit 2, nothing written
    (the check reads no checkpoint, so stand-in files do)."""
    model = fake_run(tmp_path / "ck", "checkpoint_best.pt", "checkpoint34.pt", record={"note": "the original run"})
    checkpoint, save_dir, data_out = model / "checkpoint_best.pt", tmp_path / "ft", tmp_path / "data"
    expected = "holds checkpoints of another run"
    if case.startswith("own directory"):
        save_dir = tmp_path / "ck_ft"
        shutil.copytree(model, save_dir)
        checkpoint = save_dir / "checkpoint_best.pt"
        if case == "own directory (the review's repro)":
            shutil.copy(save_dir / "checkpoint34.pt", save_dir / "checkpoint_last.pt")
        expected = f"--save-dir {save_dir} is the directory of --checkpoint {checkpoint}: fine-tuning would write"
    elif case == "holds the model as a link":
        fake_run(save_dir)
        (save_dir / "start.pt").symlink_to(checkpoint)
        expected = f"--save-dir {save_dir} holds --checkpoint {checkpoint} (as start.pt)"
    elif case == "another training run":
        fake_run(save_dir, "checkpoint_last.pt", "checkpoint1.pt", record={"dataset": "sample-es-en", "data": "/d/bin",
                                                                           "extra_args": ["--max-epoch", "1"]})
        expected += " (checkpoint1.pt and 1 more; its run.json records no fine-tune of"
    elif case == "checkpoints, no run.json":
        fake_run(save_dir, "checkpoint_best.pt")
        expected += f" (checkpoint_best.pt; its run.json records no fine-tune of {checkpoint} into this --data-out): " \
                    "fine-tuning would write over them; choose an empty --save-dir"
    elif case == "fine-tune of another model":
        fake_run(save_dir, "checkpoint_last.pt", record=finetune_record(tmp_path / "elsewhere.pt", data_out))
        expected += f" (checkpoint_last.pt; its run.json records no fine-tune of {checkpoint} into this --data-out): " \
                    f"fairseq would resume that run from checkpoint_last.pt instead of fine-tuning {checkpoint}"
    else:
        fake_run(save_dir, "checkpoint_last.pt", record=finetune_record(checkpoint, tmp_path / "other-data"))
    before = {path: path.read_bytes() for path in tmp_path.rglob("*") if path.is_file()}
    line = user_error(capsys, finetune.main, [
        "--checkpoint", checkpoint, "--dataset", "sample-es-en", "-s", "en", "-t", "es", "--data-out", data_out,
        "--save-dir", save_dir, "--train-config", "sample-es-en", "resi_dual", "3", "--vocab-from", model],
        only_line=True)
    assert expected in line, line
    assert {path: path.read_bytes() for path in tmp_path.rglob("*") if path.is_file()} == before
    assert not data_out.exists()
    # The same directory with the run.json of this very fine-tune is its own: accepted (resumed by fairseq).
    if case == "fine-tune into other data":
        (save_dir / "run.json").write_text(json.dumps(finetune_record(checkpoint, data_out)))
        finetune.check_save_dir(finetune.FinetuneRequest(checkpoint, "sample-es-en", "en", "es", data_out, save_dir))


def test_a_checkpoint_directory_is_refused_with_what_to_give(capsys, tmp_path):
    line = user_error(capsys, finetune.main, [
        "--checkpoint", tmp_path, "--dataset", "sample-es-en", "-s", "en", "-t", "es",
        "--data-out", tmp_path / "data", "--save-dir", tmp_path / "ft"], only_line=True)
    assert line == (f"error: --checkpoint {tmp_path} is a directory: give a checkpoint file "
                    f"(e.g. {tmp_path / 'checkpoint_best.pt'})")


@pytest.mark.parametrize("extra", [["--finetune-from-model", "other.pt"], ["--restore-file=other.pt"]])
def test_a_second_starting_point_after_the_dashes_is_refused(capsys, tmp_path, extra):
    (tmp_path / "model.pt").write_bytes(b"not read: refused first")
    line = user_error(capsys, finetune.main, [
        "--checkpoint", tmp_path / "model.pt", "--dataset", "sample-es-en", "-s", "en", "-t", "es",
        "--data-out", tmp_path / "data", "--save-dir", tmp_path / "ft", "--", *extra], only_line=True)
    assert line == f"error: {extra[0].partition('=')[0]} after --: residual-fairseq-finetune starts from --checkpoint itself"
    assert not (tmp_path / "data").exists() and not (tmp_path / "ft").exists()


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


def test_train_config_layers_must_be_ascii_digits(capsys, tmp_path):
    line = user_error(capsys, finetune.main, ["--checkpoint", tmp_path / "c.pt", "--dataset", "sample-es-en",
                                              "-s", "en", "-t", "es", "--data-out", tmp_path / "d",
                                              "--save-dir", tmp_path / "s", "--train-config", "sample-es-en",
                                              "resi_dual", "\u00b2"])
    assert line == "error: --train-config LAYERS must be a positive number, got '\u00b2'"


@pytest.mark.parametrize("change, problem", [
    ({"subword": None}, "is not one residual-fairseq-prepare wrote"),
    ({"source_lang": ["es"]}, "is not one residual-fairseq-prepare wrote"),
    ({"task": "language_modeling"}, "holds a language-model preparation"),
])
def test_a_vocab_from_manifest_of_another_kind_is_one_line(sample_prepared, tmp_path, change, problem):  # noqa: F811
    copy = tmp_path / "prepared"
    (copy / "bin").mkdir(parents=True)
    manifest = json.loads((sample_prepared / "manifest.json").read_text())
    (copy / "manifest.json").write_text(json.dumps({**manifest, **change}))
    with pytest.raises(finetune.UserError, match=problem):
        finetune.OriginalVocabulary.from_prepared(copy)


def test_a_dictionary_fairseq_refuses_is_one_line(es_en_checkpoint, tmp_path):
    duplicate = tmp_path / "dict.txt"
    duplicate.write_text("".join(f"w{i} 1\n" for i in range(10)) + "w1 1\n")
    with pytest.raises(finetune.UserError, match=r"dict.txt is not a fairseq dictionary: Duplicate word .*'w1'"):
        finetune.check_compatible(es_en_checkpoint, duplicate, duplicate)
