"""DeepNet, Admin and B2T through fairseq's training, checkpoints and both entry points."""
import json
import logging
import sys
import re
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf

from fairseq import models, options, tasks
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.hub_utils import GeneratorHubInterface
from fairseq.trainer import Trainer

from helpers import CLI_ENV, USER_DIR, fairseq_cli, run
from residual_fairseq import configs
from residual_fairseq.admin_profile import profile_for_training
from residual_fairseq.models import admin, deepnet
from residual_fairseq.models.admin import AdminModel
from residual_fairseq.models.b2t import B2TModel
from residual_fairseq.models.deepnet import DeepNetModel

MODEL_CLASSES = {"deepnet": DeepNetModel, "admin": AdminModel, "b2t": B2TModel}


def tiny_args(data_bin, arch, save_dir):
    return [
        str(data_bin), "--user-dir", USER_DIR, "--arch", arch, "--share-all-embeddings",
        "--encoder-layers", "3", "--decoder-layers", "2",
        "--optimizer", "adam", "--lr", "3e-3", "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "5",
        "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
        "--max-tokens", "400", "--num-workers", "0", "--cpu", "--seed", "1", "--save-dir", str(save_dir),
    ]


def train_in_memory(args, steps=12):
    """What fairseq-train does with ``args`` (flat command line), for ``steps`` updates."""
    parsed = options.parse_args_and_arch(options.get_training_parser(), args)
    cfg = convert_namespace_to_omegaconf(parsed)
    task = tasks.setup_task(cfg.task)
    model = task.build_model(cfg.model)
    built = {name: value.clone() for name, value in model.state_dict().items()}
    trainer = Trainer(cfg, task, model, task.build_criterion(cfg.criterion))
    task.load_dataset("train")
    batches = task.get_batch_iterator(task.dataset("train"), max_tokens=400, seed=1).next_epoch_itr(shuffle=True)
    for _, sample in zip(range(steps), batches):
        trainer.train_step([sample])
    trainer.consolidate_optimizer()
    trainer.save_checkpoint(str(cfg.checkpoint.save_dir) + "/checkpoint_last.pt", {})
    return cfg, task, trainer.model, built


@pytest.mark.parametrize("variant", sorted(MODEL_CLASSES))
@pytest.mark.slow
def test_flat_cli_options_reach_the_model_and_a_checkpoint_decodes_identically(variant, toy_data_bin, tmp_path,
                                                                                caplog):
    args = tiny_args(toy_data_bin, f"{variant}_tiny", tmp_path)
    profile = None
    if variant == "admin":  # the profiling step, as residual-fairseq-train runs it
        profile_path = profile_for_training(args, tmp_path / "admin_profile.json")
        profile = admin.read_profile(profile_path)
        args += ["--admin-profile", str(profile_path)]
    cfg, task, model, built = train_in_memory(args)

    if variant == "deepnet":  # the depths of the command line set the constants
        assert (model.encoder.layers[0].alpha, model.encoder.layers[0].beta) == deepnet.encoder_constants(3, 2)
        assert (model.decoder.layers[0].alpha, model.decoder.layers[0].beta) == deepnet.decoder_constants(2)
    if variant == "admin":  # --admin-profile initialised the omegas, training then moved them
        assert len(profile["encoder"]) == 3 and len(profile["decoder"]) == 2
        omega = built["encoder.layers.2.omega_ffn"]
        assert torch.equal(omega, torch.full_like(omega, profile["encoder"][2][1], dtype=torch.float32))
        assert not torch.equal(model.state_dict()["encoder.layers.2.omega_ffn"], omega)

    if variant == "admin":  # the omegas are in the checkpoint's weights: the profile is not needed again
        profile_path.unlink()

    model.eval()
    in_memory = GeneratorHubInterface(cfg, task, [model])
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="residual_fairseq"):
        reloaded = MODEL_CLASSES[variant].from_pretrained(
            str(tmp_path), checkpoint_file="checkpoint_last.pt", data_name_or_path=str(toy_data_bin))
    assert "omegas start at 1" not in caplog.text  # a loaded Admin's omegas are the checkpoint's
    assert type(reloaded.models[0]) is MODEL_CLASSES[variant]
    assert len(reloaded.models[0].encoder.layers) == 3 and len(reloaded.models[0].decoder.layers) == 2
    expected, actual = model.state_dict(), reloaded.models[0].state_dict()
    assert expected.keys() == actual.keys()
    assert all(torch.equal(expected[k], actual[k]) for k in expected)

    sentences = [line.strip() for line in open(toy_data_bin.parent / "text" / "test.src")][:6]
    sources = [in_memory.encode(s) for s in sentences]
    for want, got in zip(in_memory.generate(sources, beam=4), reloaded.generate(sources, beam=4)):
        assert torch.equal(want[0]["tokens"], got[0]["tokens"])
        torch.testing.assert_close(want[0]["score"], got[0]["score"])


@pytest.mark.parametrize("variant", sorted(MODEL_CLASSES))
def test_hydra_config_options_reach_the_model(variant, tmp_path):
    """fairseq-hydra-train's model building (a yaml model group), in process."""
    vocabulary = SimpleNamespace(source_dictionary=configs_dictionary(), target_dictionary=configs_dictionary())
    model_cfg = {"_name": f"{variant}_tiny", "encoder_layers": 4, "decoder_layers": 2, "share_all_embeddings": True}
    if variant == "admin":
        profile = {"encoder": [[1.0, 1.5]] + [[2.0, 2.5]] * 3, "decoder": [[1.0, 1.1, 1.2]] * 2}
        model_cfg["admin_profile"] = str(admin.write_profile(profile, tmp_path / "p.json"))
    model = models.build_model(OmegaConf.create(model_cfg), vocabulary)
    assert type(model) is MODEL_CLASSES[variant]
    assert (len(model.encoder.layers), len(model.decoder.layers)) == (4, 2)
    if variant == "deepnet":
        assert model.encoder.layers[0].alpha == deepnet.encoder_constants(4, 2)[0]
    if variant == "admin":
        assert admin.model_omegas(model) == {stack: [pytest.approx(v, rel=1e-6) for v in profile[stack]]
                                             for stack in profile}  # float32 omegas


def configs_dictionary():
    from residual_fairseq.variants import toy_dictionary

    return toy_dictionary(50)


@pytest.mark.slow
def test_admin_trains_through_the_train_driver_and_fairseq_hydra_train(toy_data_bin, tmp_path):
    """One command profiles then trains (residual-fairseq-train); the hydra path with the profile file."""
    save_dir = tmp_path / "driver"
    shrink = ["--encoder-layers", "2", "--decoder-layers", "2", "--max-update", "2", "--max-tokens", "600"]
    proc = run([sys.executable, "-m", "residual_fairseq.train", "--dataset", "sample-es-en", "--variant", "admin",
                "--layers", "3", "--data", toy_data_bin, "--save-dir", save_dir, "--", *shrink], env=CLI_ENV)
    log = proc.stdout + proc.stderr
    profile_path = save_dir / "admin_profile.json"
    assert "profiling Admin's omegas" in log
    assert f"Admin omegas initialised from {profile_path}" in (save_dir / "train.log").read_text()
    stored = json.loads(profile_path.read_text())
    assert len(stored["encoder"]) == len(stored["decoder"]) == 2 and stored["encoder"][0][0] == 1.0
    assert (save_dir / "checkpoint_last.pt").is_file()

    hydra_dir = tmp_path / "hydra"
    proc = run([
        fairseq_cli("fairseq-hydra-train"), "--config-dir", configs.config_dir() / "sample-es-en",
        "--config-name", "admin-3l", f"task.data={toy_data_bin}", f"common.user_dir={USER_DIR}",
        f"checkpoint.save_dir={hydra_dir}", f"model.admin_profile={profile_path}", "common.cpu=true",
        "model.encoder_layers=2", "model.decoder_layers=2", "optimization.max_update=1",
        "dataset.max_tokens=600", "checkpoint.best_checkpoint_metric=loss",
        "checkpoint.maximize_best_checkpoint_metric=false",
    ], env=CLI_ENV)
    assert re.search(f"Admin omegas initialised from {re.escape(str(profile_path))}", proc.stdout + proc.stderr)
    from fairseq import checkpoint_utils

    [model], _ = checkpoint_utils.load_model_ensemble([str(hydra_dir / "checkpoint_last.pt")])
    assert isinstance(model, AdminModel) and len(model.encoder.layers) == 2
