"""The reproduce report's statistics: Holm's correction of the seed-noise tests, the
validation loss tested beside BLEU and chrF, and the pairs the two rank differently."""
import json
import math

import pytest
from residual_fairseq import reproduce
from residual_fairseq.reproduce import report


def _holm_rejections(p_values, alpha):
    """Holm's procedure as its paper states it: walk the p values up from the smallest and
    reject while the k-th smallest (k from 0) is at most alpha / (m - k)."""
    order = sorted(range(len(p_values)), key=lambda index: p_values[index])
    rejected = set()
    for k, index in enumerate(order):
        if p_values[index] > alpha / (len(p_values) - k):
            break
        rejected.add(index)
    return rejected


def test_holm_adjusted_p_values_reject_exactly_what_holms_procedure_rejects():
    assert report.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    p_values = [0.001, 0.2, 0.013, 0.04, 0.0125, 0.9, 0.03]
    adjusted = report.holm(p_values)
    for alpha in (0.01, 0.05, 0.06, 0.1, 0.5):
        assert {index for index, p in enumerate(adjusted) if p <= alpha} == _holm_rejections(p_values, alpha)
    assert max(adjusted) <= 1.0 and all(a >= p for a, p in zip(adjusted, p_values))


def test_holm_leaves_a_test_that_could_not_be_made_out_of_the_family():
    adjusted = report.holm([0.02, math.nan, 0.04])
    assert math.isnan(adjusted[1]) and adjusted[0] == pytest.approx(0.04) and adjusted[2] == pytest.approx(0.04)
    assert report.holm([]) == []


def _finished_with_curve(run_, bleu, chrf, losses):
    """A finished run: its result.json and a train.log with one validation per loss."""
    run_.save_dir.mkdir(parents=True, exist_ok=True)
    run_.result_path.write_text(json.dumps({"sacrebleu": {"score": bleu}, "chrf": {"score": chrf}}))
    lines = ["2026-12-06 00:00:00 | INFO | fairseq.trainer | No existing checkpoint found x/checkpoint_last.pt"]
    lines += [f'2026-12-06 00:00:0{epoch} | INFO | valid | {{"epoch": {epoch}, "valid_loss": "{loss}", '
              f'"valid_num_updates": "{100 * epoch}", "valid_best_loss": "{loss}"}}'
              for epoch, loss in enumerate(losses, 1)]
    (run_.save_dir / "train.log").write_text("\n".join(lines) + "\n")


def test_seed_noise_corrects_for_every_test_of_the_table_and_tests_the_validation_loss(tmp_path):
    """A BLEU gap with p < 0.05 on its own that does not survive Holm over the table's tests is
    called so, the best validation loss is tested (lower is better), and the markdown shows
    both p values."""
    bleu = {"resi_dual": [20.0, 21.0, 22.0], "pre_ln": [18.0, 19.0, 19.5], "b2t": [17.5, 19.5, 21.0]}
    loss = {"resi_dual": [4.50, 4.52, 4.51], "pre_ln": [4.47, 4.48, 4.49], "b2t": [4.60, 4.40, 4.55]}
    runs = reproduce.matrix({"sample-es-en": tmp_path / "sample-es-en" / "bin"}, tmp_path / "out", list(bleu), layers=[6],
                            seeds=[1, 2, 3])
    for run_ in runs:
        index = run_.seed - 1
        _finished_with_curve(run_, bleu[run_.variant][index], 40.0,
                             [5.0, loss[run_.variant][index], loss[run_.variant][index] + 0.02])
    rows = {(row["metric"], row["variant"]): row for row in report.seed_noise(runs)}
    assert set(rows) == {("test sacreBLEU", "pre_ln"), ("test sacreBLEU", "b2t"), ("test chrF", "pre_ln"),
                         ("test chrF", "b2t"), ("best valid loss", "resi_dual"), ("best valid loss", "b2t")}
    assert rows[("best valid loss", "resi_dual")]["best"] == "pre_ln"
    assert rows[("best valid loss", "resi_dual")]["difference"] == pytest.approx(0.03)
    tested = [row for row in rows.values() if not math.isnan(row["p"])]
    assert len(tested) == 4  # chrF is the same for every variant: no spread to test
    expected = dict(zip([id(row) for row in tested], report.holm([row["p"] for row in tested])))
    for row in tested:
        assert row["p_holm"] == pytest.approx(expected[id(row)])
    pre_ln = rows[("test sacreBLEU", "pre_ln")]
    assert pre_ln["p"] < 0.05 <= pre_ln["p_holm"] and pre_ln["verdict"] == "uncorrected p < 0.05 only"
    assert rows[("test chrF", "pre_ln")]["verdict"] == "no spread to test"
    table = report.write_reports(runs, tmp_path / "out")["markdown"].read_text()
    assert "Holm's correction over the 4 tests of this table" in table
    assert (f"| sample-es-en | 6 | test sacreBLEU | resi_dual | pre_ln | -2.17 | {pre_ln['p']:.3f} | "
            f"{pre_ln['p_holm']:.3f} | uncorrected p < 0.05 only |") in table
    assert "- sample-es-en, 6 layers: pre_ln has the lower best valid loss (4.480 vs 4.510), resi_dual the " \
           "higher test sacreBLEU (21.00 vs 18.83)" in table


def test_rank_disagreements_name_each_pair_ranked_differently_once():
    rows = [{"dataset": "d", "variant": "a", "layers": 6, "best_valid_loss_mean": 4.40, "test_bleu_mean": 18.0},
            {"dataset": "d", "variant": "b", "layers": 6, "best_valid_loss_mean": 4.50, "test_bleu_mean": 19.0},
            {"dataset": "d", "variant": "c", "layers": 6, "best_valid_loss_mean": 4.60, "test_bleu_mean": 17.0},
            {"dataset": "d", "variant": "none", "layers": 6, "best_valid_loss_mean": None, "test_bleu_mean": None},
            {"dataset": "d", "variant": "a", "layers": 18, "best_valid_loss_mean": 4.70, "test_bleu_mean": 16.0},
            {"dataset": "d", "variant": "b", "layers": 18, "best_valid_loss_mean": 4.60, "test_bleu_mean": 17.0}]
    found = report.rank_disagreements(rows)
    assert [(item["layers"], item["lower_loss"], item["higher_bleu"]) for item in found] == [(6, "a", "b")]
    assert found[0]["losses"] == (4.40, 4.50) and found[0]["bleus"] == (18.0, 19.0)
    assert report.rank_disagreements_markdown([]) == ""
