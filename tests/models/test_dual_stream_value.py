"""The dual stream travels as a value: each forward pass owns its d.

So LayerDrop (any layer skipped, all of them included), threads sharing one model,
passes nested in a pass, passes abandoned by an exception, activation
checkpointing, TorchScript and torch.compile all give what the formula says.
"""
import math
import re
import threading

import pytest
import torch
from omegaconf import OmegaConf

from fairseq import models
from fairseq.sequence_generator import SequenceGenerator
from helpers import TINY_TRAIN_ARGS, USER_DIR, fairseq_cli, run
from residual_fairseq.variants import build_model, toy_dictionary
from helpers.formula import SMALL, random_batch, randomise_norms, reference_decoder_features, reference_encoder

NO_DROPOUT = dict(dropout=0.0, attention_dropout=0.0, activation_dropout=0.0)


def tensors_held_outside_parameters(model):
    """Tensors on modules (or on plain objects they hold) that are not parameters or buffers."""
    found = []
    for name, module in model.named_modules():
        for key, value in vars(module).items():
            if key in ("_parameters", "_buffers", "_modules", "_future_mask"):
                continue  # _future_mask: fairseq's causal-mask cache, a function of the length
            held = [value]
            if hasattr(value, "__dict__") and not isinstance(value, (torch.nn.Module, torch.Tensor, type)):
                held += list(vars(value).values())
            found += [f"{name}.{key}" for obj in held if isinstance(obj, torch.Tensor)]
    return found


def test_a_forward_pass_leaves_nothing_on_any_module():
    """No per-pass state: mid-pass no module holds a tensor of the pass, and every
    module's attributes are the same objects before and after."""
    model = build_model("resi_dual", **SMALL)
    src, lengths, prev = random_batch(model)
    mid_pass = []
    for stack in (model.encoder, model.decoder):
        stack.layers[-1].register_forward_hook(lambda m, a, o: mid_pass.append(tensors_held_outside_parameters(model)))
    before = {name: dict(vars(m)) for name, m in model.named_modules()}
    for mode in (model.train, model.eval):
        mode()
        model(src, lengths, prev)[0].sum().backward()
        with torch.no_grad():
            model(src, lengths, prev)
    # training: the mode switch; _future_mask: fairseq's decoder caches the causal mask
    # of the longest length seen (a function of the length, as in stock fairseq).
    ignore = {"training", "_future_mask"}
    for name, module in model.named_modules():
        after = {k: v for k, v in vars(module).items() if k not in ignore}
        assert after.keys() == {k for k in before[name] if k not in ignore}, name
        assert all(after[k] is before[name][k] for k in after), name
    assert len(mid_pass) == 8 and not any(mid_pass), mid_pass


def kept_layers(layers, p):
    """The layers fairseq's LayerDropModuleList keeps, drawing as it does."""
    probs = torch.empty(len(layers)).uniform_()
    # By index: iterating a LayerDropModuleList in training mode would drop layers itself.
    return [layers[i] for i in range(len(layers)) if probs[i] > p]


def test_layerdrop_any_layers_including_all_match_the_formula():
    model = build_model("resi_dual", encoder_layerdrop=0.5, decoder_layerdrop=0.5, dual_scale_encoder=0.3,
                        dual_scale_decoder=0.6, **{**SMALL, "decoder_layers": 4}, **NO_DROPOUT)
    randomise_norms(model)
    model.train()  # LayerDrop acts in training only
    src, lengths, prev = random_batch(model)
    enc_pad = src.eq(model.encoder.padding_idx)
    seen_counts = {"encoder": set(), "decoder": set()}
    for seed in range(60):
        with torch.no_grad():
            torch.manual_seed(seed)
            enc = model.encoder(src, src_lengths=lengths)
            features, _ = model.decoder(prev, encoder_out=enc, features_only=True)
            torch.manual_seed(seed)
            enc_layers = kept_layers(model.encoder.layers, 0.5)
            expected_enc = reference_encoder(model.encoder, src, 0.3, layers=enc_layers)
            dec_layers = kept_layers(model.decoder.layers, 0.5)
            expected = reference_decoder_features(model.decoder, prev, expected_enc, enc_pad, 0.6, layers=dec_layers)
        torch.testing.assert_close(enc["encoder_out"][0], expected_enc, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(features, expected, rtol=1e-5, atol=1e-5)
        seen_counts["encoder"].add(len(enc_layers))
        seen_counts["decoder"].add(len(dec_layers))
    # The seeds cover passes that ran no layer at all: y = x_0 + LN(s * x_0).
    assert 0 in seen_counts["encoder"] and 0 in seen_counts["decoder"], seen_counts


def _encoder_calls(model, n, seed):
    g = torch.Generator().manual_seed(seed)
    vocab, pad = len(model.encoder.dictionary), model.encoder.padding_idx
    calls = []
    for _ in range(n):
        bsz, length = torch.randint(1, 4, (1,), generator=g).item(), torch.randint(2, 9, (1,), generator=g).item()
        src = torch.randint(4, vocab, (bsz, length), generator=g)
        src[0, : torch.randint(0, length - 1, (1,), generator=g).item()] = pad
        calls.append((src, src.ne(pad).sum(1)))
    return calls


def _run_threads(worker, n_threads):
    results, errors = [None] * n_threads, []

    def run(i):
        try:
            results[i] = worker(i)
        except BaseException as err:  # noqa: BLE001  (reported below)
            errors.append(err)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return results


def test_threads_sharing_one_encoder_get_the_sequential_results():
    model = build_model("resi_dual", dual_scale_encoder=0.5, **SMALL).eval()
    per_thread = [_encoder_calls(model, 150, seed) for seed in range(4)]
    with torch.no_grad():
        expected = [[model.encoder(s, src_lengths=l)["encoder_out"][0] for s, l in calls] for calls in per_thread]

    def worker(i):
        with torch.no_grad():
            return [model.encoder(s, src_lengths=l)["encoder_out"][0] for s, l in per_thread[i]]

    for got, want in zip(_run_threads(worker, 4), expected):
        assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_threads_sharing_one_beam_search_get_the_sequential_hypotheses():
    model = build_model("resi_dual", **SMALL).eval()
    generator = SequenceGenerator([model], model.decoder.dictionary, beam_size=3, max_len_b=8)
    per_thread = [_encoder_calls(model, 25, seed) for seed in range(3)]

    def decode(calls):
        out = []
        for src, lengths in calls:
            hypos = generator.generate([model], {"net_input": {"src_tokens": src, "src_lengths": lengths}})
            out.append([h[0]["tokens"].tolist() for h in hypos])
        return out

    with torch.no_grad():
        expected = [decode(calls) for calls in per_thread]
    assert _run_threads(lambda i: decode(per_thread[i]), 3) == expected


def test_a_pass_nested_in_a_pass_leaves_the_outer_pass_correct():
    model = build_model("resi_dual", dual_scale_encoder=0.5, **SMALL).eval()
    randomise_norms(model)
    src, lengths, _ = random_batch(model)
    other, other_lengths, _ = random_batch(model, src_len=4)
    with torch.no_grad():
        expected = model.encoder(src, src_lengths=lengths)["encoder_out"][0]

    nested_outputs = []

    def nested_pass(module, args, output):
        if not nested_outputs:  # once, not from inside the nested pass itself
            nested_outputs.append(None)
            nested_outputs[0] = model.encoder(other, src_lengths=other_lengths)["encoder_out"][0]

    handle = model.encoder.layers[1].register_forward_hook(nested_pass)
    with torch.no_grad():
        got = model.encoder(src, src_lengths=lengths)["encoder_out"][0]
    handle.remove()
    assert torch.equal(got, expected)
    with torch.no_grad():
        assert torch.equal(nested_outputs[0], model.encoder(other, src_lengths=other_lengths)["encoder_out"][0])


def test_a_pass_abandoned_by_an_exception_leaves_no_trace():
    model = build_model("resi_dual", encoder_layerdrop=0.5, **SMALL, **NO_DROPOUT)
    randomise_norms(model)
    src, lengths, _ = random_batch(model)

    def fail(module, args, output):
        raise RuntimeError("interrupted")

    handle = model.encoder.layers[1].register_forward_hook(fail)
    model.train()
    with pytest.raises(RuntimeError, match="interrupted"), torch.no_grad():
        for seed in range(20):  # until a pass reaches layer 1
            torch.manual_seed(seed)
            model.encoder(src, src_lengths=lengths)
    handle.remove()
    for seed in range(20):
        with torch.no_grad():
            torch.manual_seed(seed)
            got = model.encoder(src, src_lengths=lengths)["encoder_out"][0]
            torch.manual_seed(seed)
            want = reference_encoder(model.encoder, src, 1.0, layers=kept_layers(model.encoder.layers, 0.5))
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def _loss_and_grads(model, seed=0, forward=None):
    """Loss and parameter gradients of one training step (``forward``: e.g. a compiled model)."""
    model.train()
    model.zero_grad(set_to_none=True)
    src, lengths, prev = random_batch(model)
    torch.manual_seed(seed)  # the same dropout masks in both models
    logits, _ = (model if forward is None else forward)(src, lengths, prev)
    loss = torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), prev.view(-1))
    loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}


def _hydra_path_model(**options):
    """The model as fairseq-hydra-train builds it: a DictConfig through fairseq's builder."""
    vocab = toy_dictionary()
    task = type("Task", (), {"source_dictionary": vocab, "target_dictionary": vocab})()
    return models.build_model(OmegaConf.create({"_name": "resi_dual", **SMALL, **options}), task)


@pytest.mark.parametrize("offload", [False, True])
@pytest.mark.parametrize("entry_point", ["flat", "hydra"])
def test_activation_checkpointing_gives_the_plain_gradients(entry_point, offload):
    options = dict(dual_scale_encoder=0.5, dual_scale_decoder=0.25, dropout=0.1, activation_dropout=0.1)
    build = (lambda **o: build_model("resi_dual", **SMALL, **o)) if entry_point == "flat" else _hydra_path_model
    torch.manual_seed(0)
    plain = build(**options)
    checkpointed = build(**options, checkpoint_activations=True, offload_activations=offload)
    assert hasattr(checkpointed.encoder.layers[0], "precheckpoint_forward")  # really wrapped
    checkpointed.load_state_dict(plain.state_dict())
    loss, grads = _loss_and_grads(plain)
    loss_ckpt, grads_ckpt = _loss_and_grads(checkpointed)
    torch.testing.assert_close(loss_ckpt, loss, rtol=0, atol=0)
    assert grads.keys() == grads_ckpt.keys()
    for name in grads:
        torch.testing.assert_close(grads_ckpt[name], grads[name], rtol=1e-6, atol=1e-7, msg=name)
    # LN_final's gradient exists only through d: it must have arrived.
    assert grads_ckpt["encoder.layer_norm.weight"].abs().sum() > 0


def test_torchscript_model_matches_eager():
    model = build_model("resi_dual", dual_scale_encoder=0.05, dual_scale_decoder=0.3, **SMALL).eval()
    randomise_norms(model)
    scripted = torch.jit.script(model)
    src, lengths, prev = random_batch(model)
    with torch.no_grad():
        torch.testing.assert_close(scripted(src, lengths, prev)[0], model(src, lengths, prev)[0],
                                   rtol=1e-5, atol=1e-5)


def test_scripted_beam_search_gives_the_eager_hypotheses():
    """As fairseq's own export tests do: torch.jit.script(SequenceGenerator)."""
    model = build_model("resi_dual", dual_scale_decoder=0.5, **SMALL).eval()
    randomise_norms(model)
    generator = SequenceGenerator([model], model.decoder.dictionary, beam_size=3, max_len_b=8)
    scripted = torch.jit.script(generator)
    src, lengths, _ = random_batch(model)
    sample = {"net_input": {"src_tokens": src, "src_lengths": lengths}}
    with torch.no_grad():
        eager = generator.forward(sample)
        script = scripted.forward(sample)
    for a, b in zip(eager, script):
        assert [h["tokens"].tolist() for h in a] == [h["tokens"].tolist() for h in b]
        torch.testing.assert_close(torch.stack([h["score"] for h in a]), torch.stack([h["score"] for h in b]))


def test_torch_compile_matches_eager_in_eval_and_training():
    model = build_model("resi_dual", dual_scale_encoder=0.5, **SMALL, **NO_DROPOUT)
    randomise_norms(model)
    src, lengths, prev = random_batch(model)
    compiled = torch.compile(model, backend="aot_eager")  # dynamo + AOT autograd, no C++ build
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(compiled(src, lengths, prev)[0], model(src, lengths, prev)[0],
                                   rtol=1e-5, atol=1e-5)
    _, grads = _loss_and_grads(model)
    _, grads_compiled = _loss_and_grads(model, forward=compiled)
    for name in grads:
        torch.testing.assert_close(grads_compiled[name], grads[name], rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.slow
def test_fairseq_train_with_layerdrop_and_activation_checkpointing(toy_data_bin, tmp_path):
    """The real CLI: LayerDrop 0.5 on 3+3 layers skips whole stacks now and then (1 pass in 8)."""
    proc = run([
        fairseq_cli("fairseq-train"), toy_data_bin, "--user-dir", USER_DIR, *TINY_TRAIN_ARGS,
        "--encoder-layers", "3", "--decoder-layers", "3",
        "--encoder-layerdrop", "0.5", "--decoder-layerdrop", "0.5", "--checkpoint-activations",
        "--max-tokens", "400", "--max-update", "240", "--save-dir", tmp_path, "--no-save",
    ])
    log = proc.stdout + proc.stderr
    losses = [float(v) for v in re.findall(r"\| loss ([\d.]+) \|", log)]
    assert re.search(r"num_updates 240\b", log) or "done training" in log, log[-2000:]
    assert len(losses) > 5 and all(math.isfinite(v) for v in losses)
    assert losses[-1] < losses[0]
