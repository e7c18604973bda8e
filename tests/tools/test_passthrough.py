"""The one pass-through flag parser (residual_fairseq.passthrough) and the run record
(residual_fairseq.run_record): what fairseq will see, and run.json written and read back."""
import os

import pytest

from residual_fairseq import run_record, train
from residual_fairseq.errors import UserError
from residual_fairseq.passthrough import flag_given, flag_value, flag_values, refuse_flags, split_passthrough


def test_split_at_the_first_lone_separator():
    assert split_passthrough(["--a", "1", "--", "--b", "--", "x"]) == (["--a", "1"], ["--b", "--", "x"])
    assert split_passthrough(["--a", "1"]) == (["--a", "1"], [])


def test_a_flags_value_is_the_last_one_fairseq_sees_in_any_spelling():
    extra = ["--max-update", "5", "--lr=0.1", "--max_update", "7", "--seed"]
    assert flag_value(extra, "--max-update") == "7"
    assert flag_values(extra, "--max-update") == ["5", "7"]
    assert flag_value(extra, "--lr") == "0.1"
    assert flag_values(extra, "--seed") == [None] and flag_value(extra, "--seed") is None
    assert flag_value(extra, "--max") is None  # a prefix is not the flag
    assert flag_given(["--reset_meters"], "--reset-meters") and not flag_given(["--reset-meters-x"], "--reset-meters")


def test_refused_flags_are_named_as_given():
    with pytest.raises(UserError, match=r"^--save_dir after --: mine$"):
        refuse_flags(["--x", "1", "--save_dir=/tmp"], ("--save-dir",), "after --: mine")
    with pytest.raises(UserError, match=r"^-s after --"):
        refuse_flags(["-sen"], ("-s",), "after --")
    refuse_flags(["--source-langs", "x", "en"], ("--source-lang",), "after --")  # another flag: accepted


def test_a_plans_number_settings_read_the_flags_after_the_separator():
    plan = train.TrainPlan([], [], {"optimization": {"max_update": 100, "max_epoch": "x"}})
    assert plan.number("optimization", "max_update") == 100
    assert plan.number("optimization", "max_update", ["--max-update=7"]) == 7
    assert plan.number("optimization", "max_epoch") == 0 and plan.number("optimization", "lr") == 0
    assert plan.number("optimization", "max_update", ["--max-update", "inf"]) == 0
    assert plan.switched_on("reset_meters", ["--reset_meters"]) and not plan.switched_on("reset_meters")


@pytest.mark.parametrize("extra, line", [
    (["--lr", "0.1,-2"], "--lr must be a finite positive number, got -2"),
    (["--max_tokens", "0"], "--max-tokens must be a finite positive number, got 0"),
    (["--dual-scale-encoder=abc"], "--dual-scale-encoder expected a number, got 'abc'"),
    (["--lr"], "--lr expected a number, got ''"),
])
def test_numbers_after_the_separator_are_checked_in_any_spelling(extra, line):
    with pytest.raises(UserError) as refused:
        train.check_extra_args(extra)
    assert str(refused.value) == line


def test_run_json_is_written_whole_and_read_back_checked(tmp_path):
    record = {"dataset": "sample-es-en", "variant": "post_ln", "layers": 2, "data": "d/bin", "name": "post_ln-2l"}
    path = run_record.write_run_record(tmp_path / "new" / "save", record)
    assert path == tmp_path / "new" / "save" / "run.json" and os.listdir(path.parent) == ["run.json"]
    assert run_record.read_run_record(path.parent) == record
    assert run_record.recorded_name(path.parent) == "post_ln-2l"
    assert run_record.read_run_record(tmp_path) is None and run_record.recorded_name(tmp_path) is None


@pytest.mark.parametrize("content, problem", [
    ("[" * 100000 + "]" * 100000, "cannot be read (RecursionError)"),
    ("x" * (run_record.MAX_BYTES + 1), "cannot be read (OSError)"),
    ('{"dataset": "a", "variant": "b", "layers": 0, "data": "c"}', "has no 'layers' from 1 to 1000"),
], ids=["nested too deep", "too large", "no depth"])
def test_a_run_json_this_tool_did_not_write_is_one_line(tmp_path, content, problem):
    (tmp_path / "run.json").write_text(content)
    with pytest.raises(UserError) as refused:
        run_record.read_run_record(tmp_path)
    assert str(refused.value) == f"{tmp_path / 'run.json'} {problem}: it is not a run record residual-fairseq-train wrote"
    assert run_record.recorded_name(tmp_path) is None


def test_a_pipe_named_run_json_is_not_read(tmp_path):
    """A FIFO would block a reader forever: neither reader waits on it."""
    os.mkfifo(tmp_path / "run.json")
    assert run_record.read_run_record(tmp_path) is None and run_record.read_any_run_record(tmp_path) is None
