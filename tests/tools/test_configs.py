"""The shipped configs: generated files up to date, models of the stated size, variants
differing only in the residual scheme, flags equivalent to the yaml, the hydra path."""
import argparse
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf

from helpers import CLI_ENV, USER_DIR, fairseq_cli, run, user_error
from residual_fairseq import configs
from residual_fairseq.errors import UserError
from residual_fairseq.variants import arch_name, toy_dictionary, variant_overrides

VOCAB = toy_dictionary(1000)


def test_generated_run_files_are_up_to_date():
    assert configs.stale_run_files() == [], "run: python3 -m residual_fairseq.configs --write"


def expected_parameters(model_cfg, variant, vocab_size):
    """Parameter count of a fairseq transformer encoder-decoder, by formula."""
    d, f = model_cfg["encoder_embed_dim"], model_cfg["encoder_ffn_embed_dim"]
    attention = 4 * d * d + 4 * d
    layer_norm = 2 * d
    ffn = 2 * d * f + f + d
    encoder_layer = attention + ffn + 2 * layer_norm
    decoder_layer = 2 * attention + ffn + 3 * layer_norm
    # Pre-LN's final LN / ResiDual's LN(d_N); the Post-LN family has none.
    stack_norms = 2 * layer_norm if variant in ("pre_ln", "resi_dual") else 0
    encoder_extra, decoder_extra = EXTRA_PER_LAYER.get(variant, (0, 0))
    encoder_layer += encoder_extra * d
    decoder_layer += decoder_extra * d
    embeddings = vocab_size * d * (1 if model_cfg.get("share_all_embeddings") else 2)
    layers = model_cfg["encoder_layers"] * encoder_layer + model_cfg["decoder_layers"] * decoder_layer
    return embeddings + layers + stack_norms


MODEL_CLASS = {"post_ln": "TransformerModel", "pre_ln": "TransformerModel", "resi_dual": "ResiDualModel",
               "deepnet": "DeepNetModel", "admin": "AdminModel", "b2t": "B2TModel"}
# Admin's omegas: the same count and shape as a model dimension per sublayer.
EXTRA_PER_LAYER = {"admin": (2, 3)}
# Encoder-decoder configs; the language-model ones are tested in test_lm_cli.py.
TRANSLATION_CONFIGS = [c for c in configs.all_configs() if configs.DATASETS[c[0]].task == "translation"]


def test_every_dataset_and_depth_has_every_variant():
    assert set(configs.VARIANTS) == set(MODEL_CLASS)
    for dataset, spec in configs.DATASETS.items():
        expected = configs.LM_VARIANTS if spec.task == "language_modeling" else configs.VARIANTS
        assert spec.variants == expected
        for layers in spec.depths:
            for variant in expected:
                assert configs.config_path(dataset, variant, layers).is_file()
    with pytest.raises(UserError, match="language modeling dataset: its variants are post_ln, pre_ln, resi_dual"):
        configs.load("sample-lm", "deepnet", 6)


@pytest.mark.parametrize("dataset,variant,layers", TRANSLATION_CONFIGS)
def test_config_builds_its_model(dataset, variant, layers):
    from fairseq import models

    settings = configs.load(dataset, variant, layers)
    model_cfg = settings["model"]
    if variant == "admin":  # no profile: the omegas start at 1, the shapes are what counts here
        assert model_cfg["admin_profile"] == configs.MISSING
        model_cfg["admin_profile"] = None
    task = SimpleNamespace(source_dictionary=VOCAB, target_dictionary=VOCAB)
    with torch.device("meta"):  # shapes only: an 18+18-layer model in milliseconds
        model = models.build_model(OmegaConf.create(model_cfg), task)  # fairseq's hydra-path builder
    assert type(model).__name__ == MODEL_CLASS[variant]
    assert len(model.encoder.layers) == len(model.decoder.layers) == layers
    assert model.encoder.layers[0].normalize_before is (variant == "pre_ln")
    assert model.decoder.layers[-1].normalize_before is (variant == "pre_ln")
    assert model.encoder.embed_tokens.embedding_dim == model_cfg["encoder_embed_dim"]
    assert model.encoder.layers[0].self_attn.num_heads == model_cfg["encoder_attention_heads"]
    if variant == "resi_dual":
        scale = configs.DATASETS[dataset].dual_scale
        assert model.encoder.dual_scale == model.decoder.dual_scale == scale
    if variant == "deepnet":  # the constants follow the config's depths
        assert model.encoder.layers[0].alpha == pytest.approx(0.81 * (layers ** 5) ** (1 / 16))
        assert model.decoder.layers[0].alpha == pytest.approx((3 * layers) ** 0.25)
    n_params = sum(p.numel() for p in model.parameters())
    assert n_params == expected_parameters(model_cfg, variant, len(VOCAB))


def test_paper_model_sizes():
    sizes = {dataset: configs.load(dataset, "resi_dual", configs.DATASETS[dataset].depths[0])["model"]
             for dataset, spec in configs.DATASETS.items() if spec.task == "translation"}
    shape = lambda m: (m["encoder_embed_dim"], m["encoder_ffn_embed_dim"], m["encoder_attention_heads"])  # noqa: E731
    assert shape(sizes["iwslt14-de-en"]) == (256, 1024, 4)
    assert shape(sizes["wmt14-en-de"]) == shape(sizes["opus100"]) == (512, 2048, 8)
    assert configs.DATASETS["opus100"].dual_scale == 0.05


def test_variants_differ_only_in_residual_scheme():
    for dataset, spec in configs.DATASETS.items():
        if spec.task != "translation":
            continue  # language models: test_lm_cli.py
        for layers in spec.depths:
            rendered = {}
            for variant in configs.VARIANTS:
                settings = configs.load(dataset, variant, layers, {"task": {"data": "D"}, "common": {"user_dir": "U"}})
                rendered[variant] = settings
                assert settings["model"]["_name"] == arch_name(variant)
                for key, value in variant_overrides(variant).items():
                    assert settings["model"][key] == value
            assert set(rendered) == set(MODEL_CLASS)
            for variant in set(configs.VARIANTS) - {"post_ln"}:
                differing = {
                    (group, key) for group in rendered["post_ln"] for key in
                    set(rendered["post_ln"][group]) | set(rendered[variant][group])
                    if rendered["post_ln"][group].get(key) != rendered[variant][group].get(key)
                }
                # The residual scheme only: its model, Pre-LN's flags, ResiDual's scales, Admin's profile.
                allowed = {("model", "_name"), ("model", "encoder_normalize_before"),
                           ("model", "decoder_normalize_before"), ("model", "dual_scale_encoder"),
                           ("model", "dual_scale_decoder"), ("model", "admin_profile")}
                assert differing and differing <= allowed, (dataset, layers, variant, differing)


@pytest.mark.parametrize("dataset,variant,layers", configs.all_configs())
def test_flags_mean_what_the_yaml_says(dataset, variant, layers):
    """fairseq-train's own parser reads the rendered flags back into the same settings."""
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    overrides = {"task": {"data": "/data"}, "common": {"user_dir": USER_DIR}}
    if variant == "admin":
        overrides["model"] = {"admin_profile": "/profile.json"}
    settings = configs.load(dataset, variant, layers, overrides)
    args = options.parse_args_and_arch(options.get_training_parser(), configs.fairseq_train_args(settings))
    parsed = convert_namespace_to_omegaconf(args)
    for group, values in settings.items():
        for key, value in values.items():
            if key == "_name":
                continue
            got = getattr(parsed[group], key) if isinstance(parsed[group], argparse.Namespace) else parsed[group][key]
            if isinstance(value, list):
                got = list(got)
            assert got == value, f"{group}.{key}: yaml {value!r}, flags give {got!r}"
    assert args.arch == settings["model"]["_name"]
    assert (args.task, args.optimizer, args.lr_scheduler, args.criterion) == (
        settings["task"]["_name"], settings["optimizer"]["_name"], settings["lr_scheduler"]["_name"],
        settings["criterion"]["_name"])


def test_unknown_choice_is_a_user_error():
    with pytest.raises(UserError, match="shipped depths: 6, 12"):
        configs.config_path("iwslt14-de-en", "resi_dual", 7)
    # Any other depth is composed from base.yaml, as the shipped files are.
    composed = configs.load("iwslt14-de-en", "resi_dual", 7, decoder_layers=5)
    shipped = configs.load("iwslt14-de-en", "resi_dual", 6)
    assert (composed["model"]["encoder_layers"], composed["model"]["decoder_layers"]) == (7, 5)
    assert {k: v for k, v in composed["model"].items() if not k.endswith("_layers")} == \
        {k: v for k, v in shipped["model"].items() if not k.endswith("_layers")}
    with pytest.raises(UserError, match="layers must be between 1 and 1000, got 0"):
        configs.load("iwslt14-de-en", "resi_dual", 0)
    with pytest.raises(UserError, match="unknown variant"):
        configs.load("iwslt14-de-en", "rezero", 6)
    with pytest.raises(UserError, match=r"missing \(\?\?\?\): task.data, common.user_dir|common.user_dir, task.data"):
        configs.fairseq_train_args(configs.load("sample-es-en", "post_ln", 3))


@pytest.mark.slow
def test_committed_yaml_trains_with_fairseq_hydra_train(toy_data_bin, tmp_path):
    """The OPUS ResiDual file as committed (0.05 dual-stream scale), shrunk by overrides."""
    save_dir = tmp_path / "hydra_run"
    proc = run([
        fairseq_cli("fairseq-hydra-train"), "--config-dir", configs.config_dir() / "opus100",
        "--config-name", "resi_dual-18l",
        f"task.data={toy_data_bin}", f"common.user_dir={USER_DIR}", f"checkpoint.save_dir={save_dir}",
        "common.cpu=true", "common.fp16=false", "common.memory_efficient_fp16=false",
        "model.encoder_layers=2", "model.decoder_layers=2", "model.encoder_embed_dim=32",
        "model.decoder_embed_dim=32", "model.encoder_ffn_embed_dim=64", "model.decoder_ffn_embed_dim=64",
        "model.encoder_attention_heads=2", "model.decoder_attention_heads=2",
        "optimization.max_update=2", "optimization.update_freq=[1]", "dataset.num_workers=0",
        "dataset.max_tokens=1200", "common.log_format=simple",
    ], env=CLI_ENV)
    output = proc.stdout + proc.stderr
    assert "ResiDualModel(" in output
    assert output.count("dual_scale=0.05") == 2  # the ResiDual encoder and decoder
    assert "num_updates=2" in output.replace(" ", "").replace("|", "") or "num_updates 2" in output
    assert (save_dir / "checkpoint_last.pt").is_file()
    assert (save_dir / ".hydra" / "config.yaml").is_file()  # hydra.run.dir follows checkpoint.save_dir


def test_flags_with_layers_that_are_not_a_number_is_one_line(capsys):
    line = user_error(capsys, configs.main, ["--flags", "sample-es-en", "resi_dual", "nan"], only_line=True)
    assert line == "error: --flags LAYERS must be a whole number, got 'nan'"


def test_flags_of_admin_render_its_profile_as_a_placeholder_and_say_how_to_write_it(capsys, tmp_path, toy_data_bin):
    """(Before: 'config values still missing (???): model.admin_profile'.) The flags name PROFILE, and the
    note on stderr is a command that writes it: following it gives a profile of the model the flags build."""
    import json
    import shlex

    from residual_fairseq.admin_profile import main as admin_profile_main

    capsys.readouterr()
    assert configs.main(["--flags", "sample-es-en", "admin", "3"]) in (None, 0)
    out, err = capsys.readouterr()
    flags = shlex.split(out)
    assert flags[flags.index("--admin-profile") + 1] == "PROFILE" and flags[flags.index("--arch") + 1] == "admin"
    assert err.strip() == configs.profile_note() and err.count("\n") == 1
    assert "python3 -m residual_fairseq.admin_profile PROFILE -- <these flags without --admin-profile PROFILE>" in err
    index = flags.index("--admin-profile")
    flags = flags[:index] + flags[index + 2:]
    flags = [str(toy_data_bin) if f == "DATA" else USER_DIR if f == "PLUGIN" else f for f in flags]
    profile = tmp_path / "profile.json"
    capsys.readouterr()
    admin_profile_main([str(profile), "--", *flags])
    assert json.loads(profile.read_text())  # a profile file was written from these very flags


def test_flags_given_twice_for_two_configs_is_refused(capsys):
    """(Before: the second config's flags were printed, the first dropped without a word.)"""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        configs.main(["--flags", "sample-es-en", "admin", "3", "--flags", "sample-es-en", "resi_dual", "3"])
    out, err = capsys.readouterr()
    assert exited.value.code == 2 and out == "" and "Traceback" not in err
    assert err.splitlines()[-1] == ("python3 -m residual_fairseq.configs: error: argument --flags: given twice with different values "
                    "(--flags sample-es-en admin 3, then --flags sample-es-en resi_dual 3): give it once")
