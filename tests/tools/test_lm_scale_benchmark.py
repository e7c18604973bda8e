"""benchmarks/lm_init_scale.py's measurement of trained language models: the best logit scale
(a temperature fitted on validation) and its refusals."""
import importlib.util
import math

import pytest
import torch
import torch.nn.functional as F
from helpers import REPO


def load_benchmark():
    spec = importlib.util.spec_from_file_location("lm_init_scale", REPO / "benchmarks" / "lm_init_scale.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_best_scale_undoes_a_known_temperature():
    """Targets drawn from softmax(z), logits given as 3z: the best factor is ~1/3, and the loss there
    is the loss of z itself, lower than at factor 1."""
    bench = load_benchmark()
    torch.manual_seed(0)
    true_logits = torch.randn(20000, 50) * 2
    targets = torch.multinomial(F.softmax(true_logits, -1), 1).squeeze(-1)
    scale, bits = bench.best_scale(3 * true_logits, targets)
    assert scale == pytest.approx(1 / 3, rel=0.03)
    assert bits == pytest.approx(F.cross_entropy(true_logits, targets).item() / math.log(2), abs=2e-3)
    assert bits < F.cross_entropy(3 * true_logits, targets).item() / math.log(2) - 0.1


def test_best_scale_of_well_scaled_logits_is_one():
    bench = load_benchmark()
    torch.manual_seed(1)
    logits = torch.randn(4, 5000, 30)
    targets = torch.multinomial(F.softmax(logits.reshape(-1, 30), -1), 1).reshape(4, 5000)
    scale, _ = bench.best_scale(logits, targets)
    assert scale == pytest.approx(1.0, abs=0.05)


def test_checkpoint_spec_needs_a_label_and_a_path():
    bench = load_benchmark()
    assert bench.checkpoint_spec("resi_dual=runs/a=b/checkpoint_best.pt") == ("resi_dual", "runs/a=b/checkpoint_best.pt")
    for bad in ("checkpoint_best.pt", "=checkpoint_best.pt", "resi_dual="):
        with pytest.raises(Exception, match="expected LABEL=CHECKPOINT"):
            bench.checkpoint_spec(bad)


def test_a_data_dir_without_a_validation_split_is_one_error_line(tmp_path, capsys):
    """A dictionary but no binarized valid split: one ``error:`` line and exit 2, no table started."""
    (tmp_path / "dict.txt").write_text("hello 3\nworld 2\n")
    with pytest.raises(SystemExit) as end:
        load_benchmark().main([str(tmp_path), "--trained", f"x={tmp_path / 'checkpoint_best.pt'}"])
    assert end.value.code == 2
    out, err = capsys.readouterr()
    assert out == "" and err.strip().splitlines() == [
        f"error: {tmp_path} holds no binarized validation split (valid.bin/.idx): pass a prepared bin/"]
