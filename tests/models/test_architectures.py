"""Each resi_dual_X architecture has the sizes of fairseq's transformer_X preset."""
import argparse

import pytest
from fairseq.models import ARCH_CONFIG_REGISTRY

from residual_fairseq.models.resi_dual import DUAL_STREAM_OPTIONS, FAIRSEQ_PRESET_OF
from residual_fairseq.variants import build_model


def preset(arch):
    args = argparse.Namespace()
    ARCH_CONFIG_REGISTRY[arch](args)
    return vars(args)


@pytest.mark.parametrize("arch", sorted(FAIRSEQ_PRESET_OF))
def test_same_settings_as_the_fairseq_preset(arch):
    ours, theirs = preset(arch), preset(FAIRSEQ_PRESET_OF[arch])
    assert {k: v for k, v in ours.items() if k not in DUAL_STREAM_OPTIONS} == theirs
    assert all(ours[name] == 1.0 for name in DUAL_STREAM_OPTIONS)


@pytest.mark.parametrize("preset_name", ["", "iwslt_de_en"])
def test_parameter_count_is_post_ln_plus_the_two_final_norms(preset_name):
    small = dict(encoder_layers=2, decoder_layers=2)
    resi_dual = build_model("resi_dual", preset_name, **small)
    post_ln = build_model("post_ln", preset_name, **small)
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    embed_dim = resi_dual.encoder.embed_tokens.embedding_dim
    # LN_final of the encoder and of the decoder: a gain and a bias each.
    assert count(resi_dual) == count(post_ln) + 2 * 2 * embed_dim


BASELINE_PRESETS = [(arch, fairseq_arch) for module in ("deepnet", "admin", "b2t")
                    for arch, fairseq_arch in sorted(__import__(f"residual_fairseq.models.{module}",
                                                                fromlist=["x"]).FAIRSEQ_PRESET_OF.items())]


@pytest.mark.parametrize("arch,fairseq_arch", BASELINE_PRESETS)
def test_baseline_presets_have_the_fairseq_sizes(arch, fairseq_arch):
    assert len(BASELINE_PRESETS) == 18  # six presets for each of DeepNet, Admin, B2T
    ours = preset(arch)
    assert ours.pop("admin_profile", None) is None  # Admin's only option: no profile unless given
    assert ours == preset(fairseq_arch)


@pytest.mark.parametrize("variant,extra", [("deepnet", 0), ("b2t", 0), ("admin", None)])
def test_baseline_parameter_count(variant, extra):
    small = dict(encoder_layers=2, decoder_layers=3)
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    model, post_ln = build_model(variant, "iwslt_de_en", **small), build_model("post_ln", "iwslt_de_en", **small)
    if extra is None:  # Admin: one omega vector per sublayer (2 per encoder layer, 3 per decoder layer)
        extra = (2 * 2 + 3 * 3) * model.encoder.embed_tokens.embedding_dim
    assert count(model) == count(post_ln) + extra


@pytest.mark.parametrize("option, value", [("dual_scale_encoder", 1e-200), ("dual_scale_decoder", 1e7),
                                           ("main_alpha_encoder", 1e300), ("main_alpha_decoder", 1e-9)])
def test_dual_stream_numbers_that_overflow_or_underflow_are_refused(option, value):
    """s scales LN_final's epsilon by s^2 (1e-200 underflows it to 0, and the output is NaN);
    an alpha of 1e300 overflows the scores: such a model (e.g. from a crafted checkpoint)
    only ever decoded into a traceback."""
    from residual_fairseq.models.resi_dual import ModelConfigError

    with pytest.raises(ModelConfigError, match=f"--{option.replace('_', '-')} must be from 1e-06 to 1e\\+06"):
        build_model("resi_dual", **{option: value})
