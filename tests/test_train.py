"""residual-fairseq-train: command rendering, CPU adaptation, dry run, real run and resume."""
import json
import shlex

import pytest

from helpers import CLI_ENV, REPO, run
from residual_fairseq import train
from residual_fairseq.errors import UserError

# Small enough for seconds of CPU training on the toy corpus.
TINY = ["--max-update", "4", "--max-tokens", "1200", "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
        "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64", "--no-epoch-checkpoints",
        "--eval-bleu-args", '{"beam": 1, "max_len_a": 0, "max_len_b": 5}', "--log-interval", "1"]


def request(data, save_dir, **kwargs):
    return train.TrainRequest("sample-es-en", "resi_dual", 3, data, save_dir, **kwargs)


def test_plan_renders_the_config_and_passes_extra_flags(toy_data_bin, tmp_path):
    plan = train.plan(request(toy_data_bin, tmp_path / "ck", seed=7, cpu=True, extra_args=["--max-epoch", "1"]))
    (command,) = plan.commands
    assert command[0].endswith("fairseq-train") and command[1] == str(toy_data_bin)
    text = shlex.join(command)
    assert "--arch resi_dual" in text and "--encoder-layers 3" in text and "--dual-scale-encoder 1.0" in text
    assert "--seed 7" in text and "--cpu" in command and command[-2:] == ["--max-epoch", "1"]
    assert f"--save-dir {tmp_path / 'ck'}" in text and "--user-dir" in text


def test_cpu_drops_fp16_and_says_so(toy_data_bin, tmp_path):
    opus = train.TrainRequest("opus100", "resi_dual", 18, toy_data_bin, tmp_path, cpu=True)
    plan = train.plan(opus)
    assert not {"--fp16", "--memory-efficient-fp16", "--amp"} & set(plan.commands[0])
    assert "--cpu" in plan.commands[0] and "--dual-scale-decoder" in plan.commands[0]
    assert any("common.fp16" in note and "common.memory_efficient_fp16" in note for note in plan.notes)
    gpu = train.plan(train.TrainRequest("opus100", "resi_dual", 18, toy_data_bin, tmp_path, cpu=False))
    assert "--fp16" in gpu.commands[0] and "--cpu" not in gpu.commands[0]


def test_cpu_multi_process_uses_gloo_ranks(toy_data_bin, tmp_path):
    plan = train.plan(request(toy_data_bin, tmp_path, nprocs=2, cpu=True))
    assert len(plan.commands) == 2
    for rank, command in enumerate(plan.commands):
        text = shlex.join(command)
        assert "--distributed-backend gloo --ddp-backend legacy_ddp" in text
        assert "--distributed-world-size 2" in text and "--distributed-no-spawn" in text
        assert "--load-checkpoint-on-all-dp-ranks" in text  # resume without a weights-only broadcast
        assert command[-2:] == ["--distributed-rank", str(rank)]
    gpu = train.plan(request(toy_data_bin, tmp_path, nprocs=4, cpu=False))
    assert len(gpu.commands) == 1 and gpu.commands[0][-2:] == ["--distributed-world-size", "4"]


def test_bad_input_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="data directory not found"):
        train.plan(request(tmp_path / "nowhere", tmp_path))
    proc = run(["python3", REPO / "scripts" / "train.py", "--dataset", "wmt14-en-de", "--variant", "pre_ln",
                "--layers", "24", "--data", tmp_path, "--save-dir", tmp_path / "x"], check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("error: ")


def test_dry_run_prints_and_runs_nothing(toy_data_bin, tmp_path, capsys):
    train.main(["--dataset", "iwslt14-de-en", "--variant", "pre_ln", "--layers", "12", "--data", str(toy_data_bin),
                "--save-dir", str(tmp_path / "ck"), "--dry-run", "--", "--max-epoch", "3"])
    out = capsys.readouterr().out
    assert "would run:" in out and "--encoder-normalize-before" in out and out.rstrip().endswith("--max-epoch 3")
    assert not (tmp_path / "ck").exists()


def test_train_then_resume(toy_data_bin, tmp_path):
    save_dir = tmp_path / "ck"
    base = ["python3", REPO / "scripts" / "train.py", "--dataset", "sample-es-en", "--variant", "resi_dual",
            "--layers", "3", "--data", toy_data_bin, "--save-dir", save_dir, "--", *TINY]
    first = run(base, env=CLI_ENV)
    assert "running:" in first.stdout and "no CUDA on this machine" in first.stdout
    assert (save_dir / "checkpoint_last.pt").is_file()
    record = json.loads((save_dir / "run.json").read_text())
    assert (record["dataset"], record["variant"], record["layers"]) == ("sample-es-en", "resi_dual", 3)
    log = (save_dir / "train.log").read_text()
    assert '"valid_loss"' in log and '"num_updates": "4"' in log

    # A kill while fairseq copies checkpoint_last.pt leaves it truncated: the driver repairs it.
    last = save_dir / "checkpoint_last.pt"
    last.write_bytes(last.read_bytes()[:4096])
    second = run(base + ["--max-update", "6"], env=CLI_ENV)
    assert "resuming from" in second.stdout
    assert f"{last} was truncated" in second.stdout and "checkpoint_best.pt" in second.stdout
    log = (save_dir / "train.log").read_text()
    assert "Loaded checkpoint" in log and '"num_updates": "6"' in log


def test_two_cpu_processes_train_together(toy_data_bin, tmp_path):
    save_dir = tmp_path / "ddp"
    proc = run(["python3", REPO / "scripts" / "train.py", "--dataset", "sample-es-en", "--variant", "resi_dual",
                "--layers", "3", "--data", toy_data_bin, "--save-dir", save_dir, "--nprocs", "2",
                "--", *TINY, "--max-update", "2"], env=CLI_ENV)
    assert "training on 2 devices" in (save_dir / "train.log").read_text()
    assert (save_dir / "checkpoint_last.pt").is_file() and (save_dir / "train.rank1.log").is_file()
    assert "gloo" in proc.stdout
