"""The paper's authors' option names and checkpoint layout.

Their fairseq 0.12.2 implementation stores a transformer arch plus
enc/dec_res_input_norm_scale and enc/dec_alpha, and names LN_final of the dual
stream encoder/decoder.layer_norm.{weight,bias}. The test input is built here
from that description.
"""
import argparse
import re

import pytest
import torch
import yaml
from omegaconf import OmegaConf

from fairseq import checkpoint_utils, models, options
from fairseq.sequence_generator import SequenceGenerator
from helpers import USER_DIR, run
from residual_fairseq.convert import convert_checkpoint, main
from residual_fairseq.variants import toy_dictionary

OURS_TO_OFFICIAL = {
    "dual_scale_encoder": "enc_res_input_norm_scale", "dual_scale_decoder": "dec_res_input_norm_scale",
    "main_alpha_encoder": "enc_alpha", "main_alpha_decoder": "dec_alpha",
}


def authors_checkpoint(trained_tiny, path):
    """The trained tiny resi_dual checkpoint, rewritten as the authors' code stores one."""
    _, save_dir, _ = trained_tiny
    state = torch.load(save_dir / "checkpoint_last.pt", weights_only=True)
    args = state["cfg"]["model"]  # fairseq 0.12 keeps a legacy model's options as a Namespace here
    for ours, official in OURS_TO_OFFICIAL.items():
        setattr(args, official, getattr(args, ours))
        delattr(args, ours)
    args.arch = args._name = "transformer_tiny"
    assert "encoder.layer_norm.weight" in state["model"] and "decoder.layer_norm.bias" in state["model"]
    torch.save(state, path)
    return path


def hypotheses(model, src):
    generator = SequenceGenerator([model], model.decoder.dictionary, beam_size=4, max_len_b=10)
    sample = {"net_input": {"src_tokens": src, "src_lengths": src.ne(1).sum(1)}}
    with torch.no_grad():
        return [[(h["tokens"].tolist(), h["score"].item()) for h in hyps] for hyps in generator.forward(sample)]


def test_authors_checkpoint_converts_and_decodes_identically(trained_tiny, tmp_path):
    data_bin, save_dir, _ = trained_tiny
    source = authors_checkpoint(trained_tiny, tmp_path / "authors.pt")
    output = tmp_path / "converted.pt"
    assert main([str(source), str(output)]) is None
    [original], _ = checkpoint_utils.load_model_ensemble([str(save_dir / "checkpoint_last.pt")])
    [converted], _ = checkpoint_utils.load_model_ensemble([str(output)])
    assert type(converted).__name__ == "ResiDualModel"
    assert (converted.encoder.dual_scale, converted.decoder.dual_scale) == (0.5, 0.25)
    original.eval(), converted.eval()
    src = torch.randint(4, len(original.encoder.dictionary), (4, 9), generator=torch.Generator().manual_seed(0))
    assert hypotheses(converted, src) == hypotheses(original, src)


def test_converter_refuses_to_overwrite_and_to_convert_a_pre_ln_model(trained_tiny, tmp_path, capsys):
    source = authors_checkpoint(trained_tiny, tmp_path / "authors.pt")
    existing = tmp_path / "existing.pt"
    existing.write_bytes(b"keep me")
    with pytest.raises(SystemExit) as stop:
        main([str(source), str(existing)])
    assert stop.value.code == 2 and existing.read_bytes() == b"keep me"
    assert capsys.readouterr().err.strip().startswith("error: ")
    state = torch.load(source, weights_only=True)
    state["cfg"]["model"].encoder_normalize_before = True
    torch.save(state, tmp_path / "pre_ln.pt")
    with pytest.raises(Exception, match="Pre-LN"):
        convert_checkpoint(tmp_path / "pre_ln.pt", tmp_path / "out.pt")
    assert not (tmp_path / "out.pt").exists()



@pytest.mark.parametrize("change, refusal", [
    (lambda a: setattr(a, "enc_alpha", "abc"), "the checkpoint's enc_alpha is 'abc', not a finite number"),
    (lambda a: setattr(a, "dec_res_input_norm_scale", [1, 2]), "dec_res_input_norm_scale is '\\[1, 2\\]'"),
    (lambda a: setattr(a, "enc_alpha", float("nan")), "enc_alpha is 'nan', not a finite number"),
    (lambda a: setattr(a, "encoder_layers", 5000), "its config asks for 5000 encoder layers, its weights hold 2"),
])
def test_converter_refuses_hostile_options_in_one_line(trained_tiny, tmp_path, capsys, change, refusal):
    source = authors_checkpoint(trained_tiny, tmp_path / "authors.pt")
    state = torch.load(source, weights_only=True)
    change(state["cfg"]["model"])
    torch.save(state, source)
    with pytest.raises(SystemExit) as stop:
        main([str(source), str(tmp_path / "out.pt")])
    error = capsys.readouterr().err.strip()
    assert stop.value.code == 2 and error.startswith("error: ") and "\n" not in error
    assert re.search(refusal, error), error
    assert not (tmp_path / "out.pt").exists()

def test_official_option_names_reach_the_model_from_a_hydra_yaml(tmp_path):
    (tmp_path / "model.yaml").write_text(yaml.safe_dump({
        "_name": "resi_dual_tiny", "enc_res_input_norm_scale": 0.05, "dec_res_input_norm_scale": 0.1,
        "enc_alpha": 0.5, "dec_alpha": 2.0,
    }))
    vocab = toy_dictionary()
    task = argparse.Namespace(source_dictionary=vocab, target_dictionary=vocab)
    model = models.build_model(OmegaConf.load(tmp_path / "model.yaml"), task)  # fairseq's hydra-path builder
    assert (model.encoder.dual_scale, model.decoder.dual_scale) == (0.05, 0.1)
    assert (model.encoder.main_alpha, model.decoder.main_alpha) == (0.5, 2.0)


def test_official_option_names_on_the_command_line(toy_data_bin):
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [
        str(toy_data_bin), "--user-dir", USER_DIR, "--arch", "resi_dual_tiny",
        "--enc-res-input-norm-scale", "0.05", "--dec-alpha", "1.5",
    ])
    assert (args.dual_scale_encoder, args.dual_scale_decoder, args.main_alpha_decoder) == (0.05, 1.0, 1.5)


def test_contradicting_names_are_refused_not_silently_merged():
    vocab = toy_dictionary()
    task = argparse.Namespace(source_dictionary=vocab, target_dictionary=vocab)
    cfg = OmegaConf.create({"_name": "resi_dual_tiny", "enc_res_input_norm_scale": 0.05, "dual_scale_encoder": 0.5})
    with pytest.raises(ValueError, match="enc_res_input_norm_scale=0.05 contradicts dual_scale_encoder=0.5"):
        models.build_model(cfg, task)


def test_convert_cli_runs_as_a_console_script(trained_tiny, tmp_path):
    source = authors_checkpoint(trained_tiny, tmp_path / "authors.pt")
    proc = run(["residual-fairseq-convert", source, tmp_path / "out.pt"])
    assert "dual_scale_encoder=0.5" in proc.stdout and (tmp_path / "out.pt").is_file()


def test_a_directory_is_refused_naming_a_checkpoint_file_to_give(tmp_path, capsys):
    """The loader's message for a directory named average-checkpoints' --num-epoch-checkpoints,
    which convert does not have."""
    (tmp_path / "run").mkdir()
    with pytest.raises(SystemExit) as stop:
        main([str(tmp_path / "run"), str(tmp_path / "out.pt")])
    assert stop.value.code == 2
    assert capsys.readouterr().err == (f"error: {tmp_path / 'run'} is a directory: convert takes one checkpoint file, "
                                       f"e.g. {tmp_path / 'run' / 'checkpoint_best.pt'}\n")
    assert not (tmp_path / "out.pt").exists()
