"""Step-by-step decoding with fairseq's incremental state equals the full forward."""
import torch

from residual_fairseq.variants import build_model
from helpers.formula import SMALL, random_batch, randomise_norms


def test_incremental_decoding_matches_teacher_forcing():
    model = build_model("resi_dual", dual_scale_encoder=0.3, dual_scale_decoder=0.7, **SMALL)
    randomise_norms(model)
    model.eval()
    src, lengths, prev = random_batch(model)  # row 2 of prev ends in padding
    pad = model.decoder.padding_idx
    with torch.no_grad():
        enc = model.encoder(src, src_lengths=lengths)
        full, _ = model.decoder(prev, encoder_out=enc)
        state = {}
        steps = [
            model.decoder(prev[:, : t + 1], encoder_out=enc, incremental_state=state)[0]
            for t in range(prev.size(1))
        ]
    stepwise = torch.cat(steps, dim=1)
    real = prev.ne(pad)
    assert real.sum() < real.numel(), "the batch must contain padding"
    torch.testing.assert_close(stepwise[real], full[real], rtol=1e-5, atol=1e-5)


def test_beam_reordering_keeps_per_hypothesis_state():
    """Reordering the incremental state (as beam search does) matches decoding the reordered batch.

    As in beam search, the rows are hypotheses of one source sentence: fairseq does
    not reorder the cached encoder keys when the batch size is unchanged.
    """
    model = build_model("resi_dual", **SMALL)
    model.eval()
    src, lengths, prev = random_batch(model)
    src, lengths = src[:1].repeat(3, 1), lengths[:1].repeat(3)
    order = torch.tensor([2, 0, 0])
    with torch.no_grad():
        enc = model.encoder(src, src_lengths=lengths)
        state = {}
        for t in (1, 2):  # fairseq feeds one new token per incremental call
            model.decoder(prev[:, :t], encoder_out=enc, incremental_state=state)
        model.decoder.reorder_incremental_state_scripting(state, order)
        enc_r = model.encoder.reorder_encoder_out(enc, order)
        step = model.decoder(prev[order, :3], encoder_out=enc_r, incremental_state=state)[0]
        full = model.decoder(prev[order, :3], encoder_out=enc_r)[0][:, -1:]
    torch.testing.assert_close(step, full, rtol=1e-5, atol=1e-5)
