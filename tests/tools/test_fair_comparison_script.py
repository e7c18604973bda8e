"""benchmarks/fair_comparison.sh (issue 37's steps in one script): the flags each step trains with,
dry; its refusals. And benchmarks/same_training.sh's refusals (its comparison: a run of minutes,
recorded in docs/figures/fair-comparison/)."""
import json
import re
import subprocess

import pytest
from helpers import CLI_ENV, REPO

SCRIPT = REPO / "benchmarks" / "fair_comparison.sh"
SELECTED = "--max-epoch 40 --patience 5 --lr {lr} --dropout 0.1 --attention-dropout 0.1 --activation-dropout 0.1"
STEPS = "dropout lr6 lr18 short6 short18 select extend seeds warmup lm6 lm24"


def script(out, *steps, **env):
    return subprocess.run(["bash", str(SCRIPT), str(out), *steps], capture_output=True, text=True, timeout=600,
                          env={**CLI_ENV, **env})


@pytest.mark.slow
def test_each_step_trains_with_the_protocols_flags(toy_data_bin, tmp_path):
    """Dry: step 1 trains Pre-LN 6L at dropout 0.1 and 0.3; lr6 trains the six variants at each rate with
    the chosen dropout, lr 5e-3 taking step 1's run at that dropout from its runs.json (an OUT with a
    space: the path stays one word)."""
    out = tmp_path / "fair comparison"
    (out / "dropout-0.1").mkdir(parents=True)
    (out / "dropout-0.1" / "runs.json").write_text("[]\n")
    proc = script(out, "dropout", "lr6", DRY="1", DATA=str(toy_data_bin))
    assert proc.returncode == 0, proc.stderr[-3000:]
    trains = [line for line in proc.stdout.splitlines() if "fairseq-train" in line]
    assert len(trains) == 2 + 3 * 6, proc.stdout[-3000:]
    for dropout, command in zip(("0.1", "0.3"), trains):
        assert "--arch transformer" in command and "--encoder-layers 6" in command
        assert command.endswith(f"--max-epoch 40 --patience 5 --dropout {dropout} --attention-dropout 0.1 "
                                "--activation-dropout 0.1"), command
    for lr, commands in zip(("5e-3", "2e-3", "1e-3"), (trains[2:8], trains[8:14], trains[14:20])):
        assert all(command.endswith(SELECTED.format(lr=lr)) for command in commands), commands
    assert f"--finished-runs {out}/dropout-0.1/runs.json --extend --out {out}/lr-5e-3" in proc.stdout
    assert [line.count("--finished-runs") for line in proc.stdout.splitlines() if line.startswith("+ reproduce")] == [
        0, 0, 1, 0, 0], proc.stdout[-3000:]
    assert "note: that reproduce exited" not in proc.stdout
    assert not (out / "lr-5e-3" / "runs.json").exists()


def reproduce_lines(stdout):
    """(the flags before --, the flags after --) of each reproduce the script ran, in order."""
    lines = [line[len("+ reproduce "):] for line in stdout.splitlines()
             if line.startswith("+ reproduce ") and "--report-only" not in line]
    return [tuple(part.strip() for part in line.split(" -- ", 1)) for line in lines]


@pytest.mark.slow
def test_the_shortened_selection_trains_the_check_row_in_full_and_the_others_short(toy_data_bin, tmp_path):
    """short6: at each rate Pre-LN (the check row) to the 40-epoch budget, the other five variants for
    SHORT epochs; select rewrites each rate's runs.json from its whole --out before choosing, and checks
    the first SHORT epochs. (lr6 trains shortened runs on with --extend: the test above.)"""
    proc = script(tmp_path, "short6", "select", DRY="1", DATA=str(toy_data_bin), SHORT="3")
    assert proc.returncode == 0, proc.stderr[-3000:]
    calls = reproduce_lines(proc.stdout)
    assert len(calls) == 6, proc.stdout[-3000:]
    short = [(ours, theirs) for ours, theirs in calls]
    for rate, (check, others) in zip(("5e-3", "2e-3", "1e-3"), (short[0:2], short[2:4], short[4:6])):
        assert "--variants pre_ln --layers 6 --seeds 1" in check[0] and check[1] == SELECTED.format(lr=rate)
        assert "--variants post_ln deepnet admin b2t resi_dual --layers 6 --seeds 1" in others[0]
        assert others[1] == SELECTED.format(lr=rate).replace("--max-epoch 40", "--max-epoch 3")
        assert f"--out {tmp_path}/lr-{rate}" in check[0] and f"--out {tmp_path}/lr-{rate}" in others[0]
    assert [line for line in proc.stdout.splitlines() if "--report-only" in line] == [
        f"+ reproduce --report-only --out {tmp_path}/lr-{rate}" for rate in ("5e-3", "2e-3", "1e-3")]
    assert f"--out {tmp_path}/best-lr --check-epochs 3" in proc.stdout
    trains = [line for line in proc.stdout.splitlines() if "fairseq-train" in line]
    assert len(trains) == 3 * 6, proc.stdout[-3000:]


def selection_row(variant, layers, chosen, verdict):
    """A row as residual-fairseq-best-lr writes it in selection.json."""
    return {"dataset": "sample-es-en", "data": "sample-es-en", "variant": variant, "layers": layers,
            "runs": {}, "missing": [], "chosen": chosen, "ranking": [chosen], "budget_limited": [],
            "check": {"verdict": verdict, "ranking": [chosen]} if verdict else None}


@pytest.mark.slow
def test_extend_trains_on_the_chosen_rates_where_the_check_row_agrees_and_every_rate_where_not(toy_data_bin, tmp_path):
    """The rule fixed before any shortened run: 6 layers, the check row agrees: each row's chosen run is
    trained on to the full budget; 18 layers, it disagrees: every rate of every chosen row is."""
    (tmp_path / "best-lr").mkdir()
    rows = [selection_row("pre_ln", 6, "5e-3", "agrees"), selection_row("resi_dual", 6, "2e-3", "cannot tell"),
            selection_row("pre_ln", 18, "2e-3", "disagrees"),
            {**selection_row("b2t", 18, None, None), "missing": ["5e-3"], "ranking": None}]
    (tmp_path / "best-lr" / "selection.json").write_text(json.dumps({"rows": rows}))
    proc = script(tmp_path, "extend", DRY="1", DATA=str(toy_data_bin))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "6 layers: the check row pre_ln: agrees, so each chosen rate is trained on" in proc.stderr
    assert "18 layers: the check row pre_ln: disagrees, so every rate is trained on" in proc.stderr
    calls = [(re.search(r"--variants (\S+) --layers (\d+)", ours).groups(), re.search(r"--out \S+/lr-(\S+)", ours)[1], theirs)
             for ours, theirs in reproduce_lines(proc.stdout)]
    assert [(variant, int(layers), rate) for (variant, layers), rate, _ in calls] == [
        ("pre_ln", 6, "5e-3"), ("resi_dual", 6, "2e-3"),
        ("pre_ln", 18, "5e-3"), ("pre_ln", 18, "2e-3"), ("pre_ln", 18, "1e-3")]
    assert all(theirs == SELECTED.format(lr=rate) for _, rate, theirs in calls)
    assert all("--extend" in ours and "--seeds 1 " in ours for ours, _ in reproduce_lines(proc.stdout))


@pytest.mark.slow
@pytest.mark.parametrize("steps, refusal", [
    (None, f"error: usage: fair_comparison.sh OUT STEP... (steps: {STEPS})"),
    ((), f"error: give at least one step: {STEPS}"),
    (("lr6", "lr7"), f"error: unknown step lr7 (steps: {STEPS})"),
    (("seeds",), "error: no {out}/best-lr/selection.json: run the select step first"),
    (("extend",), "error: no {out}/best-lr/selection.json: run the select step first"),
    (("select", "lm6"), "error: LM_DATA={out}/data/sample-lm/bin is not a directory (sample-lm's prepared bin/)"),
    (("dropout",), "error: DATA={out}/data/sample-es-en/bin is not a directory (sample-es-en's prepared bin/)"),
])
def test_what_it_cannot_do_is_one_line_and_exit_2_before_training(tmp_path, steps, refusal):
    proc = (subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, env=CLI_ENV) if steps is None
            else script(tmp_path, *steps, DATA=str(tmp_path)) if steps in (("seeds",), ("extend",))
            else script(tmp_path, *steps))
    assert proc.returncode == 2 and proc.stderr.strip() == refusal.format(out=tmp_path), proc.stderr
    assert "reproduce" not in proc.stdout


@pytest.mark.slow
@pytest.mark.parametrize("env, refusal", [
    ({"SHORT": "0"}, "error: SHORT=0 is not a whole number of epochs above 0 (digits, no leading 0)"),
    ({"SHORT": "8.5"}, "error: SHORT=8.5 is not a whole number of epochs above 0 (digits, no leading 0)"),
    ({"SHORT": "-3"}, "error: SHORT=-3 is not a whole number of epochs above 0 (digits, no leading 0)"),
    ({"FULL": "4O"}, "error: FULL=4O is not a whole number of epochs above 0 (digits, no leading 0)"),
    ({"SHORT": "40"}, "error: SHORT=40 is not shorter than the 40-epoch budget (FULL)"),
    ({"FULL": "8"}, "error: SHORT=8 is not shorter than the 8-epoch budget (FULL)"),
])
def test_a_budget_that_is_not_one_or_a_shortened_run_that_is_not_shorter_is_refused(tmp_path, env, refusal):
    proc = script(tmp_path, "short6", DATA=str(tmp_path), **env)
    assert proc.returncode == 2 and proc.stderr.strip() == refusal, proc.stderr
    assert not list(tmp_path.iterdir())


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


@pytest.mark.slow
@pytest.mark.parametrize("content", [
    b"\xff{", b'{"rows": 3}', json.dumps({"rows": [selection_row("pre_ln", 6, "5e-3; rm -rf ~", "agrees")]}).encode(),
    json.dumps({"rows": [selection_row("pre_ln $(id)", 6, "5e-3", "agrees")]}).encode(),
    json.dumps({"rows": [selection_row("pre_ln", "6 --extend", "5e-3", "agrees")]}).encode(),
])
def test_a_selection_that_best_lr_did_not_write_trains_nothing(tmp_path, content):
    """seeds and extend read best-lr's selection.json as hostile: a rate outside the grid, a variant or
    depth that is not one would reach reproduce's command line unquoted; one error line, exit 2."""
    (tmp_path / "best-lr").mkdir()
    (tmp_path / "best-lr" / "selection.json").write_bytes(content)
    for step in ("seeds", "extend"):
        proc = script(tmp_path, step, DATA=str(tmp_path), DRY="1")
        assert proc.returncode == 2 and proc.stderr.strip() == (
            f"error: {tmp_path}/best-lr/selection.json is not what residual-fairseq-best-lr writes: run the select "
            "step again"), proc.stderr
        assert "reproduce" not in proc.stdout
