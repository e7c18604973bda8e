"""Evaluation: checkpoint averaging, fairseq-generate wiring, BLEU/chrF scoring."""
import json
import math
import os
import shutil
from pathlib import Path

import pytest
import sacrebleu
import torch
from sacremoses import MosesTokenizer

from helpers import user_error
from residual_fairseq import average_checkpoints as averaging
from residual_fairseq import evaluate
from residual_fairseq.scoring import split_compounds, tokenized_bleu
from helpers.trained_models import AVERAGE_LAST, TOY_EPOCHS, toy_evaluation

RAW_REFERENCES = [
    "The cat's toy is on the well-known mat.",
    'He said: "no" & left.',
    "A state-of-the-art model, again (twice).",
    "It costs 3.5 < 4 dollars!",
]
RAW_HYPOTHESES = [
    "The cat's toy is on the mat.",
    'He said "no" and left.',
    "A state-of-the-art system, again.",
    "It costs 3.5 dollars!",
]


@pytest.fixture(scope="module")
def toy_run(toy_data_bin):
    return toy_evaluation(toy_data_bin)


def fake_generate_output(path, hypotheses, references):
    """A fairseq-generate output of Moses-tokenized text, ids out of order as fairseq prints them."""
    tokenizer = MosesTokenizer(lang="en")
    lines = []
    for i in reversed(range(len(hypotheses))):
        hyp = tokenizer.tokenize(hypotheses[i], escape=True, return_str=True)
        ref = tokenizer.tokenize(references[i], escape=True, return_str=True)
        lines += [f"S-{i}\tsource {i}", f"T-{i}\t{ref}", f"H-{i}\t-0.5\t{hyp}", f"D-{i}\t-0.5\t{hyp}",
                  f"P-{i}\t-0.1 -0.2"]
    path.write_text("\n".join(["2026 | INFO | log line"] + lines + ["Generate test with beam=5: BLEU4 = 1.0"]) + "\n")
    return path


# --- checkpoint averaging ---------------------------------------------------------------

def test_averaged_checkpoint_is_the_mean_of_the_last_n(toy_run):
    save_dir, result = toy_run
    expected_sources = [str(save_dir / f"checkpoint{epoch}.pt")
                        for epoch in range(TOY_EPOCHS, TOY_EPOCHS - AVERAGE_LAST, -1)]
    assert result["averaged_from"] == expected_sources
    # Averaged beside the result file; nothing is written into the checkpoint directory.
    assert result["checkpoint"] == str(save_dir / "eval" / "test.averaged.pt")
    assert not list(save_dir.glob("checkpoint.avg*"))
    sources = [torch.load(path, map_location="cpu", weights_only=True)["model"] for path in expected_sources]
    averaged = torch.load(result["checkpoint"], map_location="cpu", weights_only=True)
    assert set(averaged["model"]) == set(sources[0])
    for name, tensor in averaged["model"].items():
        mean = sum(source[name].double() for source in sources) / len(sources)
        assert tensor.dtype == sources[0][name].dtype
        assert torch.allclose(tensor.double(), mean, rtol=1e-6, atol=1e-7), name
    # Not a copy of one input: the checkpoints really differ, so the mean is new.
    some_weight = next(name for name in sources[0] if name.endswith("fc1.weight"))
    assert not torch.equal(sources[0][some_weight], sources[1][some_weight])
    # The rest of the state is the newest checkpoint's, so fairseq loads it as usual.
    newest = torch.load(expected_sources[0], map_location="cpu", weights_only=True)
    assert averaged["optimizer_history"] == newest["optimizer_history"]
    assert averaged["cfg"]["model"].arch == "resi_dual_tiny"
    # ... and it decodes: fairseq-generate translated the whole test set with it.
    assert result["num_sentences"] == 40


def test_update_checkpoints_are_picked_by_update_number(tmp_path):
    for name in ("checkpoint_1_50.pt", "checkpoint_2_100.pt", "checkpoint_2_150.pt", "checkpoint_3_200.pt",
                 "checkpoint3.pt", "checkpoint_last.pt"):
        (tmp_path / name).touch()
    chosen = averaging.last_n_checkpoints(tmp_path, 2, update_based=True)
    assert chosen == [str(tmp_path / "checkpoint_3_200.pt"), str(tmp_path / "checkpoint_2_150.pt")]
    bounded = averaging.last_n_checkpoints(tmp_path, 2, update_based=True, upper_bound=150)
    assert bounded == [str(tmp_path / "checkpoint_2_150.pt"), str(tmp_path / "checkpoint_2_100.pt")]


def test_average_cli_errors_are_one_line(tmp_path, capsys):
    (tmp_path / "checkpoint1.pt").touch()
    (tmp_path / "broken.pt").write_text("not a checkpoint")
    cases = [
        ["--inputs", str(tmp_path), "--num-epoch-checkpoints", "2", "--output", str(tmp_path / "avg.pt")],
        ["--inputs", str(tmp_path / "broken.pt"), "--output", str(tmp_path / "avg.pt")],
        ["--inputs", str(tmp_path / "missing.pt"), "--output", str(tmp_path / "avg.pt")],
    ]
    for argv in cases:
        with pytest.raises(SystemExit) as exit_info:
            averaging.main(argv)
        assert exit_info.value.code == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: ") and "\n" not in err, err
    assert not (tmp_path / "avg.pt").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp files left


# --- scoring ----------------------------------------------------------------------------

def test_scores_reproduce_sacrebleu_on_fixed_files(tmp_path):
    generate_output = fake_generate_output(tmp_path / "gen.txt", RAW_HYPOTHESES, RAW_REFERENCES)
    result = evaluate.score_generate_output(generate_output, detok_lang="en", hypotheses_path=tmp_path / "hyp.txt")

    # Detokenization undoes the Moses tokenization (and its XML escapes) exactly.
    assert (tmp_path / "hyp.txt").read_text().splitlines() == RAW_HYPOTHESES
    bleu = sacrebleu.metrics.BLEU()
    expected_bleu = bleu.corpus_score(RAW_HYPOTHESES, [RAW_REFERENCES])
    chrf = sacrebleu.metrics.CHRF()
    expected_chrf = chrf.corpus_score(RAW_HYPOTHESES, [RAW_REFERENCES])
    assert result["sacrebleu"]["score"] == expected_bleu.score
    assert result["sacrebleu"]["signature"] == str(bleu.get_signature())
    assert result["sacrebleu"]["signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:")
    assert result["chrf"]["score"] == expected_chrf.score
    assert result["chrf"]["signature"] == str(chrf.get_signature())
    assert 0 < result["sacrebleu"]["score"] < 100 and result["num_sentences"] == 4

    # A raw reference file gives the same numbers as the detokenized T lines here.
    (tmp_path / "ref.txt").write_text("\n".join(RAW_REFERENCES) + "\n")
    with_file = evaluate.score_generate_output(generate_output, detok_lang="en", reference=tmp_path / "ref.txt")
    assert with_file["sacrebleu"]["score"] == expected_bleu.score
    assert with_file["reference"] == str(tmp_path / "ref.txt")


def test_compound_split_like_the_perl_recipe():
    # Expected: the output of perl -ple 's{(\S)-(\S)}{$1 ##AT##-##AT## $2}g' on the same
    # line. Matches don't overlap, so one-character parts of a chain stay joined.
    assert split_compounds("a well-known state-of-the-art x - y a-b-c 1-2-3-4") == (
        "a well ##AT##-##AT## known state ##AT##-##AT## of ##AT##-##AT## the ##AT##-##AT## art x - y "
        "a ##AT##-##AT## b-c 1 ##AT##-##AT## 2-3 ##AT##-##AT## 4")


def test_compound_split_bleu_matches_a_hand_computed_value():
    hypothesis, reference = ["the well-known cat sat"], ["the well-known dog sat"]
    # After splitting both are 6 tokens: the well ##AT##-##AT## known {cat|dog} sat.
    # Matching n-grams: 1-grams 5/6, 2-grams 3/5, 3-grams 2/4, 4-grams 1/3; equal
    # lengths, so BP = 1 and BLEU = (5/6 * 3/5 * 2/4 * 1/3) ** (1/4) = (1/12) ** (1/4).
    split = tokenized_bleu(hypothesis, reference, compound_split=True)
    assert split["score"] == pytest.approx(100 * (1 / 12) ** 0.25, abs=1e-9)
    assert split["precisions"] == pytest.approx([100 * 5 / 6, 100 * 3 / 5, 100 * 2 / 4, 100 * 1 / 3])
    # Unsplit, "well-known" is one token: no 3-gram matches, and unsmoothed BLEU is 0.
    unsplit = tokenized_bleu(hypothesis, reference, compound_split=False)
    assert unsplit["precisions"][:3] == pytest.approx([100 * 3 / 4, 100 * 1 / 3, 0.0])
    assert unsplit["score"] == 0.0


def test_scoring_rejects_unparallel_files(tmp_path, capsys):
    generate_output = fake_generate_output(tmp_path / "gen.txt", RAW_HYPOTHESES, RAW_REFERENCES)
    (tmp_path / "short-ref.txt").write_text("only one line\n")
    with pytest.raises(SystemExit) as exit_info:
        evaluate.main(["--from-generate-output", str(generate_output), "--reference", str(tmp_path / "short-ref.txt")])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip() == (
        "error: 4 hypotheses but 1 references: the files must be parallel")


# --- end to end -------------------------------------------------------------------------

def test_evaluate_run_writes_the_result_json(toy_run, toy_data_bin):
    save_dir, result = toy_run
    written = json.loads((save_dir / "eval" / "test.json").read_text())
    assert written == result
    for field in ("checkpoint", "averaged_from", "data", "subset", "generation", "generate_command",
                  "sacrebleu", "chrf", "tokenized_bleu", "num_sentences", "hypotheses", "generate_output"):
        assert field in written, field
    assert written["data"] == str(toy_data_bin)
    assert written["generation"]["beam"] == 5 and written["generation"]["lenpen"] == 1.0
    assert "fairseq-generate" in written["generate_command"] and "--user-dir" in written["generate_command"]
    assert "|tok:13a|" in written["sacrebleu"]["signature"]
    assert math.isfinite(written["sacrebleu"]["score"]) and math.isfinite(written["chrf"]["score"])
    hypotheses = open(written["hypotheses"]).read().splitlines()
    assert len(hypotheses) == written["num_sentences"] == 40
    # The scored hypotheses are fairseq-generate's, in test-set order.
    assert hypotheses == evaluate.read_generate_output(written["generate_output"])[0]


def test_evaluate_cli_errors_are_one_line(tmp_path, toy_data_bin, capsys):
    cases = [
        ([str(tmp_path / "missing.pt"), str(toy_data_bin)], f"error: checkpoint not found: {tmp_path / 'missing.pt'}"),
        ([str(tmp_path), str(toy_data_bin)], f"error: no checkpoint_best.pt in {tmp_path}: "
                                             "give a checkpoint file or --last-n N"),
        ([str(tmp_path), str(toy_data_bin), "--subset", "nope"], "error: no binarized 'nope' split in"),
    ]
    for argv, expected in cases:
        with pytest.raises(SystemExit) as exit_info:
            evaluate.main(argv)
        assert exit_info.value.code == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(expected) and "\n" not in err, err


# --- result files, inputs and options (no fairseq-generate: it is faked or never reached) ----------------

def fake_run_generate(calls, sentences=40):
    """A stand-in for fairseq-generate that 'translates' every test sentence perfectly."""
    def run_generate(command, output_path, threads=None, log_path=None):
        calls.append(list(command))
        Path(output_path).parent.mkdir(parents=True, exist_ok=True)  # as the real one does
        Path(log_path).write_text("fake log\n")
        Path(output_path).write_text("".join(f"S-{i}\tw{i}\nT-{i}\tW{i} W1\nH-{i}\t-0.5\tW{i} W1\n"
                                             for i in range(sentences)))
    return run_generate


def linked_checkpoints(save_dir, directory, names=("checkpoint10.pt", "checkpoint11.pt", "checkpoint12.pt",
                                                   "checkpoint_best.pt")):
    directory.mkdir()
    for name in names:
        (directory / name).symlink_to(save_dir / name)
    return directory


def test_result_side_files_and_default_names_do_not_collide(toy_run, toy_data_bin, tmp_path, monkeypatch):
    save_dir, _ = toy_run
    monkeypatch.setattr(evaluate.translation, "run_generate", fake_run_generate(calls := []))
    ck = linked_checkpoints(save_dir, tmp_path / "ck")
    # Two checkpoints of one run, and its checkpoint_best.pt, each get their own default result.
    for checkpoint, name in ((ck / "checkpoint11.pt", "eval-test-checkpoint11.json"),
                             (ck / "checkpoint12.pt", "eval-test-checkpoint12.json"), (ck, "eval-test.json")):
        result = evaluate.evaluate_run(checkpoint, toy_data_bin)
        assert result["result_file"] == str(ck / name)
    assert json.loads((ck / "eval-test-checkpoint11.json").read_text())["checkpoint"] == str(ck / "checkpoint11.pt")
    assert json.loads((ck / "eval-test-checkpoint12.json").read_text())["checkpoint"] == str(ck / "checkpoint12.pt")
    assert evaluate.default_result_name("test", None, 5, update_based=True) == "eval-test-avg5-updates.json"
    # A dot in --out-json is not a suffix: only a final .json is stripped for the side files.
    for lenpen in ("0.6", "0.8"):
        evaluate.evaluate_run(ck / "checkpoint12.pt", toy_data_bin, lenpen=float(lenpen),
                              out_json=tmp_path / "lp" / f"eval-lenpen{lenpen}")
    for lenpen in ("0.6", "0.8"):
        written = json.loads((tmp_path / "lp" / f"eval-lenpen{lenpen}").read_text())
        assert f"--lenpen {lenpen}" in written["generate_command"]
        for field, suffix in (("hypotheses", "hyp.txt"), ("generate_output", "generate.txt"),
                              ("generate_log", "generate.txt.log")):
            assert written[field] == str(tmp_path / "lp" / f"eval-lenpen{lenpen}.{suffix}")
            assert Path(written[field]).is_file()
    assert len(calls) == 5


def test_averaging_writes_beside_the_result_not_into_the_checkpoint_dir(toy_run, toy_data_bin, tmp_path,
                                                                         monkeypatch):
    save_dir, _ = toy_run
    monkeypatch.setattr(evaluate.translation, "run_generate", fake_run_generate(calls := []))
    ck = linked_checkpoints(save_dir, tmp_path / "ck")
    before = sorted(p.name for p in ck.iterdir())
    ck.chmod(0o555)  # read-only (root writes anyway: the listing below is the real check)
    try:
        result = evaluate.evaluate_run(ck, toy_data_bin, last_n=2, out_json=tmp_path / "out" / "r.json")
    finally:
        ck.chmod(0o755)
    assert sorted(p.name for p in ck.iterdir()) == before
    averaged = tmp_path / "out" / "r.averaged.pt"
    sources = [str(ck / "checkpoint12.pt"), str(ck / "checkpoint11.pt")]
    assert result["checkpoint"] == str(averaged) and result["averaged_from"] == sources
    assert result["averaging"] == {"last_n": 2, "update_based": False, "directory": str(ck), "checkpoints": sources,
                                   "averaged_checkpoint": str(averaged)}
    # fairseq-generate read a staged copy; the result names the file that stays.
    assert f"--path {averaged} " in result["generate_command"] and str(averaged) not in calls[0]
    weights = [torch.load(path, map_location="cpu", weights_only=True)["model"] for path in [averaged] + sources]
    name = next(n for n in weights[0] if n.endswith("fc1.weight"))
    assert torch.allclose(weights[0][name], (weights[1][name] + weights[2][name]) / 2, atol=1e-6)
    assert sorted(p.name for p in averaged.parent.iterdir()) == [
        "r.averaged.pt", "r.generate.txt", "r.generate.txt.log", "r.hyp.txt", "r.json"]


def test_failed_generate_keeps_the_earlier_log(toy_run, toy_data_bin, tmp_path, monkeypatch):
    save_dir, _ = toy_run
    out = tmp_path / "r.json"
    earlier = {out: "{}\n", tmp_path / "r.generate.txt": "earlier\n", tmp_path / "r.generate.txt.log": "earlier log\n"}
    for path, text in earlier.items():
        path.write_text(text)
    # The real run_generate, running a command that logs and fails the way fairseq-generate can.
    monkeypatch.setattr(evaluate.translation, "generate_command",
                        lambda *args: ["sh", "-c", "echo 'some progress' >&2; echo 'ValueError: bad' >&2; exit 3"])
    with pytest.raises(evaluate.UserError) as failed:
        evaluate.evaluate_run(save_dir / "checkpoint12.pt", toy_data_bin, out_json=out)
    failed_log = tmp_path / "r.generate.failed.txt.log"
    assert str(failed.value) == f"fairseq-generate exited 3: ValueError: bad (full log: {failed_log})"
    assert {path: path.read_text() for path in earlier} == earlier
    assert failed_log.read_text() == "some progress\nValueError: bad\n"
    assert not list(tmp_path.glob("*.partial-*"))


def test_outputs_that_are_inputs_are_refused(toy_run, toy_data_bin, tmp_path, capsys):
    save_dir, _ = toy_run
    ck = linked_checkpoints(save_dir, tmp_path / "ck")
    model = ck / "checkpoint12.pt"
    model_bytes = model.read_bytes()
    (tmp_path / "link.json").symlink_to(model)
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "x.hyp.txt").write_text("a reference\n")
    generated = fake_generate_output(tmp_path / "gen.txt", RAW_HYPOTHESES, RAW_REFERENCES)
    cases = [
        ([model, toy_data_bin, "--out-json", model], f"--out-json {model} would overwrite the checkpoint {model}"),
        ([model, toy_data_bin, "--out-json", tmp_path / "link.json"], "would overwrite the checkpoint"),
        ([ck, toy_data_bin, "--last-n", "2", "--out-json", ck / "checkpoint11.pt"],
         "would overwrite a checkpoint being averaged"),
        ([model, toy_data_bin, "--out-json", tmp_path / "r" / "x.json", "--reference", tmp_path / "r" / "x.hyp.txt"],
         f"(its side file {tmp_path / 'r' / 'x.hyp.txt'}) would overwrite the --reference file"),
        ([model, toy_data_bin, "--out-json", toy_data_bin / "dict.tgt.txt"], "would overwrite the data file"),
        (["--from-generate-output", generated, "--out-json", generated],
         "would overwrite the --from-generate-output file"),
    ]
    for argv, expected in cases:
        line = user_error(capsys, evaluate.main, argv)
        assert expected in line, line
    assert model.is_symlink() and model.read_bytes() == model_bytes
    assert (tmp_path / "link.json").is_symlink() and (tmp_path / "r" / "x.hyp.txt").read_text() == "a reference\n"
    assert generated.read_text().startswith("2026 | INFO")
    assert not list(tmp_path.rglob("*.partial-*")) and not list(tmp_path.rglob("*.averaged.pt"))


def test_no_output_replaces_a_file_of_the_data_it_reads(toy_run, toy_data_bin, tmp_path, capsys, monkeypatch):
    """Issue 38: --out-json DATA/manifest.json (or spm.model beside OUT/bin, or a split that is
    not the one scored) replaced it, and the next evaluate failed. What is not the data's (an
    earlier result written there) may still be replaced by a rerun."""
    save_dir, _ = toy_run
    prepared = tmp_path / "prepared"
    shutil.copytree(toy_data_bin, prepared / "bin")
    manifest = json.dumps({"note": "prepare's manifest", "files": {"spm.model": {}, "bin/dict.src.txt": {}}})
    files = {prepared / "manifest.json": manifest, prepared / "spm.model": "model\n"}
    for path, text in files.items():
        path.write_text(text)
    other_split = next((prepared / "bin").glob("valid.*.idx"))
    files[other_split] = other_split.read_bytes()
    model = save_dir / "checkpoint12.pt"
    for out, expected in ((prepared / "manifest.json", "would overwrite a file of the prepared data"),
                          (prepared / "spm.model", "would overwrite a file of the prepared data"),
                          (other_split, "would overwrite the data file")):
        line = user_error(capsys, evaluate.main, [model, prepared / "bin", "--out-json", out])
        assert line.startswith(f"error: --out-json {out} {expected} {out}"), line
    for path, content in files.items():
        assert (path.read_bytes() if isinstance(content, bytes) else path.read_text()) == content
    assert not list(tmp_path.rglob("*.partial-*"))
    monkeypatch.setattr(evaluate.translation, "run_generate", fake_run_generate([]))
    for _ in range(2):  # a result kept beside the data is the user's, not the data's: rerunning replaces it
        evaluate.evaluate_run(model, prepared / "bin", out_json=prepared / "bin" / "eval.json", subword="none")
    assert json.loads((prepared / "bin" / "eval.json").read_text())["num_sentences"] == 40


def test_options_that_do_not_apply_are_refused(toy_run, toy_data_bin, tmp_path, capsys, monkeypatch):
    save_dir, _ = toy_run
    monkeypatch.setattr(evaluate.translation, "run_generate", fake_run_generate(calls := []))
    lm_data = tmp_path / "lm"
    lm_data.mkdir()
    (lm_data / "dict.txt").write_text("w1 1\n")
    model = save_dir / "checkpoint12.pt"
    line = user_error(capsys, evaluate.main, [model, lm_data, "--last-n", "5", "--reference", "nonexist.txt",
                                              "--beam", "5"])
    assert line.startswith("error: --last-n, --beam, --reference do not apply to language-model data"), line
    line = user_error(capsys, evaluate.main, [model, toy_data_bin, "--context-window", "8"])
    assert line.startswith("error: --context-window does not apply to translation data"), line
    # --generate-args may not override what the result records (it would say beam 5 on test)
    for extra, flag in (("--beam 1", "--beam"), ("--gen-subset valid", "--gen-subset"),
                        ("--remove-bpe=none", "--remove-bpe"), ("--required-batch-size-multiple 8",
                                                                 "--required-batch-size-multiple")):
        line = user_error(capsys, evaluate.main, [model, toy_data_bin, f"--generate-args={extra}"])
        assert line.startswith(f"error: {flag} in --generate-args: the evaluation sets it itself"), line
    # Issue 38: flags after which fairseq-generate prints no test translation (--score-reference
    # scored the references as hypotheses: sacreBLEU 99.98, exit 0), and a flag given twice.
    for extra, flag in (("--score-reference", "--score-reference"), ("--prefix-size 2", "--prefix-size"),
                        ("--sampling --sampling-topk 5", "--sampling"), ("--sampling-topp=0.9", "--sampling-topp"),
                        ("--retain-dropout", "--retain-dropout")):
        line = user_error(capsys, evaluate.main, [model, toy_data_bin, f"--generate-args={extra}"])
        assert line.startswith(f"error: {flag} in --generate-args: fairseq-generate would then print no test "
                               "translation"), line
    line = user_error(capsys, evaluate.main, [model, toy_data_bin, "--generate-args=--max-len-b 5 --max-len-b=9"])
    assert line == "error: --max-len-b is given twice in --generate-args: fairseq would use the last one; give it once"
    evaluate.check_generate_extra_args(["--print-alignment", "--nbest", "2", "--max-len-b", "9", "--temperature", "1"])
    generated = fake_generate_output(tmp_path / "gen.txt", RAW_HYPOTHESES, RAW_REFERENCES)
    line = user_error(capsys, evaluate.main, ["--from-generate-output", generated, "--subword", "sentencepiece"])
    assert line.startswith("error: --subword does not apply with --from-generate-output"), line
    assert calls == []
    # An output scored without subword removal is scored, with a warning.
    marked = tmp_path / "marked.txt"
    marked.write_text("".join(f"T-{i}\t\u2581W{i} \u2581W1\nH-{i}\t-0.5\t\u2581W{i} \u2581W1\n" for i in range(3)))
    evaluate.main(["--from-generate-output", str(marked)])
    captured = capsys.readouterr()
    assert "warning: the hypotheses in" in captured.err and "--remove-bpe sentencepiece" in captured.err
    assert "3 sentences" in captured.out


def test_subword_method_from_the_manifest_or_refused(toy_run, toy_data_bin, tmp_path, capsys, monkeypatch):
    save_dir, _ = toy_run
    monkeypatch.setattr(evaluate.translation, "run_generate", fake_run_generate(calls := []))
    model = save_dir / "checkpoint12.pt"
    prepared = tmp_path / "prepared"
    shutil.copytree(toy_data_bin, prepared / "bin")
    manifest = {"format": 1, "dataset": "custom", "source_lang": "src", "target_lang": "tgt", "settings": {},
                "subword": {"method": "spm-bpe", "model": "spm.model"}, "files": {}, "binarized": "bin"}
    (prepared / "manifest.json").write_text(json.dumps(manifest))
    result = evaluate.evaluate_run(model, prepared / "bin", out_json=tmp_path / "a.json")
    assert calls[-1][calls[-1].index("--remove-bpe") + 1] == "sentencepiece"
    assert result["generation"]["subword"] == "spm-bpe"
    assert result["generation"]["subword_from"] == str((prepared / "manifest.json").resolve())
    result = evaluate.evaluate_run(model, prepared / "bin", subword="none", out_json=tmp_path / "b.json")
    assert "--remove-bpe" not in calls[-1] and result["generation"]["subword_from"] == "--subword"
    assert result["detok_lang"] is None  # the manifest's text was not Moses-tokenized
    # Moses-tokenized text is detokenized in the target language of the split, unless told otherwise.
    manifest["settings"]["tokenizer"] = "moses"
    (prepared / "manifest.json").write_text(json.dumps(manifest))
    assert evaluate.evaluate_run(model, prepared / "bin", out_json=tmp_path / "m.json")["detok_lang"] == "tgt"
    assert evaluate.evaluate_run(model, prepared / "bin", detok_lang="de", out_json=tmp_path / "m.json")[
        "detok_lang"] == "de"
    # Without a manifest, a dictionary that is clearly segmented is refused before generating.
    (prepared / "manifest.json").unlink()
    n_calls = len(calls)
    dictionary = prepared / "bin" / "dict.tgt.txt"
    original = dictionary.read_text()
    dictionary.write_text("".join("\u2581" + line + "\n" for line in original.splitlines()))
    line = user_error(capsys, evaluate.main, [model, prepared / "bin", "--out-json", tmp_path / "c.json"])
    assert "carry subword marks" in line and "give --subword sentencepiece" in line, line
    dictionary.write_text("".join(line.replace(" ", "@@ ", 1) + "\n" for line in original.splitlines()))
    line = user_error(capsys, evaluate.main, [model, prepared / "bin", "--out-json", tmp_path / "c.json"])
    assert "give --subword subword_nmt" in line, line
    assert len(calls) == n_calls and not (tmp_path / "c.json").exists()
    # An explicit --subword wins; unmarked data need none.
    assert evaluate.resolve_subword("none", prepared / "bin") == ("none", "--subword")
    assert evaluate.resolve_subword(None, toy_data_bin) == (None, None)


@pytest.mark.slow
def test_a_killed_evaluation_takes_fairseq_generate_with_it(tmp_path):
    """SIGTERM ends Python without cleanup: its fairseq-generate must not go on writing."""
    import signal
    import subprocess
    import sys
    import time

    pid_file = tmp_path / "child.pid"
    script = (f"from residual_fairseq.evaluate import run_generate\n"
              f"run_generate(['sh', '-c', 'echo $$ > {pid_file}; exec sleep 60'], r'{tmp_path / 'out.txt'}')\n")
    driver = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not (pid_file.exists() and pid_file.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.1)
    child = int(pid_file.read_text())
    driver.send_signal(signal.SIGTERM)
    driver.wait(timeout=30)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and os.path.exists(f"/proc/{child}") and \
            open(f"/proc/{child}/stat").read().split()[2] != "Z":
        time.sleep(0.1)
    assert not os.path.exists(f"/proc/{child}") or open(f"/proc/{child}/stat").read().split()[2] == "Z"


def test_staging_files_of_a_killed_evaluation_are_removed_by_the_next(tmp_path):
    from residual_fairseq.evaluate import remove_abandoned_staging

    out = tmp_path / "r.generate.txt"
    dead, alive = 999999999, os.getpid()
    left = [tmp_path / f"r.generate.txt.partial-{dead}", tmp_path / f".r.generate.txt.partial-{dead}.host-{dead}.x.tmp"]
    kept = [tmp_path / f"r.generate.txt.partial-{alive}", tmp_path / "r.generate.txt.partial-notes", out]
    for path in left + kept:
        path.write_text("x")
    remove_abandoned_staging([out])
    assert not any(path.exists() for path in left) and all(path.exists() for path in kept)
