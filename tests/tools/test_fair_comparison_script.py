"""benchmarks/fair_comparison.sh (issue 37's steps in one script): the flags each step trains with,
dry; its refusals. And benchmarks/same_training.sh's refusals (its comparison: a run of minutes,
recorded in docs/figures/fair-comparison/)."""
import subprocess

import pytest
from helpers import CLI_ENV, REPO

SCRIPT = REPO / "benchmarks" / "fair_comparison.sh"
SELECTED = "--max-epoch 40 --patience 5 --lr {lr} --dropout 0.1 --attention-dropout 0.1 --activation-dropout 0.1"


def script(out, *steps, **env):
    return subprocess.run(["bash", str(SCRIPT), str(out), *steps], capture_output=True, text=True, timeout=600,
                          env={**CLI_ENV, **env})


@pytest.mark.slow
def test_each_step_trains_with_the_protocols_flags(toy_data_bin, tmp_path):
    """Dry: step 1 trains Pre-LN 6L at dropout 0.1 and 0.3; lr6 trains the six variants at each rate with
    the chosen dropout, lr 5e-3 taking step 1's run at that dropout from its runs.json."""
    (tmp_path / "dropout-0.1").mkdir()
    (tmp_path / "dropout-0.1" / "runs.json").write_text("[]\n")
    proc = script(tmp_path, "dropout", "lr6", DRY="1", DATA=str(toy_data_bin))
    assert proc.returncode == 0, proc.stderr[-3000:]
    trains = [line for line in proc.stdout.splitlines() if "fairseq-train" in line]
    assert len(trains) == 2 + 3 * 6, proc.stdout[-3000:]
    for dropout, command in zip(("0.1", "0.3"), trains):
        assert "--arch transformer" in command and "--encoder-layers 6" in command
        assert command.endswith(f"--max-epoch 40 --patience 5 --dropout {dropout} --attention-dropout 0.1 "
                                "--activation-dropout 0.1"), command
    for lr, commands in zip(("5e-3", "2e-3", "1e-3"), (trains[2:8], trains[8:14], trains[14:20])):
        assert all(command.endswith(SELECTED.format(lr=lr)) for command in commands), commands
    assert f"--finished-runs {tmp_path}/dropout-0.1/runs.json --out {tmp_path}/lr-5e-3" in proc.stdout
    assert f"--finished-runs {tmp_path}/dropout-0.1/runs.json --out {tmp_path}/lr-2e-3" not in proc.stdout
    assert not (tmp_path / "lr-5e-3" / "runs.json").exists()


@pytest.mark.slow
@pytest.mark.parametrize("steps, refusal", [
    (None, "error: usage: fair_comparison.sh OUT STEP... (steps: dropout lr6 lr18 select seeds warmup lm6 lm24)"),
    ((), "error: give at least one step: dropout lr6 lr18 select seeds warmup lm6 lm24"),
    (("lr6", "lr7"), "error: unknown step lr7 (steps: dropout lr6 lr18 select seeds warmup lm6 lm24)"),
    (("seeds",), "error: no {out}/best-lr/selection.json: run the select step first"),
    (("select", "lm6"), "error: LM_DATA={out}/data/sample-lm/bin is not a directory (sample-lm's prepared bin/)"),
    (("dropout",), "error: DATA={out}/data/sample-es-en/bin is not a directory (sample-es-en's prepared bin/)"),
])
def test_what_it_cannot_do_is_one_line_and_exit_2_before_training(tmp_path, steps, refusal):
    proc = (subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, env=CLI_ENV) if steps is None
            else script(tmp_path, *steps, DATA=str(tmp_path)) if steps == ("seeds",) else script(tmp_path, *steps))
    assert proc.returncode == 2 and proc.stderr.strip() == refusal.format(out=tmp_path), proc.stderr
    assert "reproduce" not in proc.stdout


@pytest.mark.slow
@pytest.mark.parametrize("args, refusal", [
    ([], "error: usage: same_training.sh CHECKOUT_A CHECKOUT_B DATA_BIN"),
    (["{repo}", "{tmp}", "{tmp}"], "error: {tmp} is not a residual-fairseq checkout (no scripts/train.py)"),
    (["{repo}", "{repo}", "{tmp}"], "error: {tmp} is not sample-es-en's prepared bin/ (no dict.en.txt)"),
])
def test_same_training_refuses_what_it_cannot_compare(tmp_path, args, refusal):
    proc = subprocess.run(["bash", str(REPO / "benchmarks" / "same_training.sh"),
                           *(arg.format(repo=REPO, tmp=tmp_path) for arg in args)],
                          capture_output=True, text=True, env=CLI_ENV, timeout=60)
    assert proc.returncode == 2 and proc.stderr.strip() == refusal.format(tmp=tmp_path), proc.stderr
    assert not list(tmp_path.iterdir())
