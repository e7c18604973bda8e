"""Evaluation: checkpoint averaging, fairseq-generate wiring, BLEU/chrF scoring."""
import json
import math

import pytest
import sacrebleu
import torch
from sacremoses import MosesTokenizer

from residual_fairseq import average_checkpoints as averaging
from residual_fairseq import evaluate
from residual_fairseq.scoring import split_compounds, tokenized_bleu
from trained_models import AVERAGE_LAST, TOY_EPOCHS, toy_evaluation

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
