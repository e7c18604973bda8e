"""The plugin through fairseq's real command-line tools, in subprocesses."""
import re

import pytest
import sacrebleu
import torch

import residual_fairseq  # noqa: F401  (allowlists fairseq's checkpoint globals)
from helpers import TINY_TRAIN_ARGS, USER_DIR, fairseq_cli, run


pytestmark = pytest.mark.slow  # every test here runs fairseq's CLIs in subprocesses


def train_losses(log):
    return [float(m) for m in re.findall(r"\| train \| epoch \d+ \| loss ([\d.]+)", log)]


def test_train_generate_score(trained_tiny):
    data_bin, save_dir, log = trained_tiny
    losses = train_losses(log)
    assert len(losses) > 10 and losses[-1] < 0.5 * losses[0], losses

    proc = run([
        fairseq_cli("fairseq-generate"), data_bin, "--user-dir", USER_DIR, "--cpu", "--num-workers", "0",
        "--path", save_dir / "checkpoint_last.pt", "--gen-subset", "test", "--beam", "5",
    ])
    hyps, refs = {}, {}
    for line in proc.stdout.splitlines():
        kind, _, rest = line.partition("-")
        if kind in ("H", "T"):
            idx, *fields = rest.split("\t")
            (hyps if kind == "H" else refs)[int(idx)] = fields[-1]
    assert len(hyps) == len(refs) == 40
    order = sorted(refs)
    bleu = sacrebleu.corpus_bleu([hyps[i] for i in order], [[refs[i] for i in order]])
    # The toy task (reverse and re-case the words) is learnable: a broken model scores ~0.
    assert bleu.score > 10, bleu


def test_cli_options_reach_the_model(trained_tiny):
    _, save_dir, log = trained_tiny
    # fairseq logs the model; each ResiDual stack prints the scale it uses.
    assert re.search(r"\(encoder\): ResiDualEncoder\(.*?dual_scale=0\.5\b", log, re.S)
    assert re.search(r"\(decoder\): ResiDualDecoder\(.*?dual_scale=0\.25\b", log, re.S)
    from fairseq import checkpoint_utils

    [model], _ = checkpoint_utils.load_model_ensemble([str(save_dir / "checkpoint_last.pt")])
    assert (model.encoder.dual_scale, model.decoder.dual_scale) == (0.5, 0.25)


def test_hydra_yaml_options_reach_the_model(toy_data_bin, tmp_path):
    """fairseq-hydra-train with a yaml config: plugin fields must not be dropped."""
    (tmp_path / "tiny.yaml").write_text(f"""
common: {{cpu: true, user_dir: {USER_DIR}, log_format: simple, log_interval: 1, seed: 1}}
task: {{_name: translation, data: {toy_data_bin}}}
model: {{_name: resi_dual_tiny, share_all_embeddings: true, dual_scale_encoder: 0.125, dual_scale_decoder: 0.375, encoder_layers: 3}}
criterion: {{_name: label_smoothed_cross_entropy, label_smoothing: 0.1}}
optimizer: {{_name: adam}}
lr_scheduler: {{_name: inverse_sqrt, warmup_updates: 10}}
optimization: {{lr: [0.001], max_update: 2}}
dataset: {{max_tokens: 500, num_workers: 0}}
checkpoint: {{save_dir: {tmp_path / 'ckpt'}}}
""")
    proc = run([fairseq_cli("fairseq-hydra-train"), "--config-dir", tmp_path, "--config-name", "tiny"], cwd=tmp_path)
    log = proc.stdout + proc.stderr
    assert re.search(r"\(encoder\): ResiDualEncoder\(.*?dual_scale=0\.125\b", log, re.S), log[-3000:]
    assert re.search(r"\(decoder\): ResiDualDecoder\(.*?dual_scale=0\.375\b", log, re.S)
    from fairseq import checkpoint_utils

    [model], _ = checkpoint_utils.load_model_ensemble([str(tmp_path / "ckpt" / "checkpoint_last.pt")])
    assert len(model.encoder.layers) == 3
    assert (model.encoder.dual_scale, model.decoder.dual_scale) == (0.125, 0.375)

    # A bad value in the yaml: hydra reports it as it reports its own config errors,
    # its "Error executing job" line and the message, not a traceback.
    (tmp_path / "bad.yaml").write_text((tmp_path / "tiny.yaml").read_text()
                                       .replace("dual_scale_decoder: 0.375", "dual_scale_decoder: -1")
                                       .replace(str(tmp_path / "ckpt"), str(tmp_path / "bad")))
    proc = run([fairseq_cli("fairseq-hydra-train"), "--config-dir", tmp_path, "--config-name", "bad"],
               cwd=tmp_path, check=False)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert re.search(r"^Error executing job with overrides: \[\]\n--dual-scale-decoder must be a finite "
                     r"positive number, got -1\n", proc.stderr, re.M), proc.stderr[-3000:]
    assert not (tmp_path / "bad" / "checkpoint_last.pt").exists()


def test_resume_from_checkpoint_last(trained_tiny, tmp_path):
    data_bin, save_dir, _ = trained_tiny
    resume_dir = tmp_path / "resume"
    resume_dir.mkdir()
    (resume_dir / "checkpoint_last.pt").write_bytes((save_dir / "checkpoint_last.pt").read_bytes())
    proc = run([
        fairseq_cli("fairseq-train"), data_bin, "--user-dir", USER_DIR, *TINY_TRAIN_ARGS,
        "--dual-scale-encoder", "0.5", "--dual-scale-decoder", "0.25",
        "--max-tokens", "400", "--max-update", "320", "--save-dir", resume_dir,
    ])
    log = proc.stdout + proc.stderr
    assert re.search(r"Loaded checkpoint .*checkpoint_last\.pt \(epoch \d+ @ 300 updates\)", log), log[-3000:]
    assert "num_updates 320" in log
    state = torch.load(resume_dir / "checkpoint_last.pt", weights_only=True)
    assert state["optimizer_history"][-1]["num_updates"] == 320


def test_bad_model_option_is_one_argparse_line(toy_data_bin):
    proc = run([
        fairseq_cli("fairseq-train"), toy_data_bin, "--user-dir", USER_DIR, "--arch", "resi_dual_tiny",
        "--cpu", "--dual-scale-decoder", "-0.5",
    ], check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == (
        "fairseq-train: error: argument --dual-scale-decoder: must be a finite positive number, got -0.5"
    )
