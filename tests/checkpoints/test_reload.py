"""A ResiDual checkpoint reloaded through from_pretrained decodes exactly like the model that saved it."""
import pytest
import torch

from fairseq import options, tasks
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.hub_utils import GeneratorHubInterface
from fairseq.trainer import Trainer

from helpers import TINY_TRAIN_ARGS, USER_DIR
from residual_fairseq import ResiDualModel


pytestmark = pytest.mark.slow  # every test here trains a model


def train_in_memory(data_bin, save_dir, steps=30):
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [
        str(data_bin), "--user-dir", USER_DIR, *TINY_TRAIN_ARGS,
        "--dual-scale-encoder", "0.3", "--max-tokens", "400", "--save-dir", str(save_dir),
    ])
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    model = task.build_model(cfg.model)
    trainer = Trainer(cfg, task, model, task.build_criterion(cfg.criterion))
    task.load_dataset("train")
    batches = task.get_batch_iterator(task.dataset("train"), max_tokens=400, seed=1).next_epoch_itr(shuffle=True)
    for _, sample in zip(range(steps), batches):
        trainer.train_step([sample])
    trainer.consolidate_optimizer()  # fairseq-train does this before every save
    trainer.save_checkpoint(str(save_dir / "checkpoint_last.pt"), {})
    return cfg, task, trainer.model


def test_from_pretrained_decodes_identically(toy_data_bin, tmp_path):
    cfg, task, model = train_in_memory(toy_data_bin, tmp_path)
    model.eval()
    in_memory = GeneratorHubInterface(cfg, task, [model])
    reloaded = ResiDualModel.from_pretrained(
        str(tmp_path), checkpoint_file="checkpoint_last.pt", data_name_or_path=str(toy_data_bin)
    )
    assert isinstance(reloaded.models[0], ResiDualModel)
    assert reloaded.models[0].encoder.dual_scale == 0.3

    expected, actual = model.state_dict(), reloaded.models[0].state_dict()
    assert expected.keys() == actual.keys()
    assert all(torch.equal(expected[k], actual[k]) for k in expected)

    sentences = [line.strip() for line in open(toy_data_bin.parent / "text" / "test.src")][:8]
    sources = [in_memory.encode(s) for s in sentences]
    want = in_memory.generate(sources, beam=5)
    got = reloaded.generate(sources, beam=5)
    for w, g in zip(want, got):
        assert torch.equal(w[0]["tokens"], g[0]["tokens"])
        torch.testing.assert_close(w[0]["score"], g[0]["score"])
    assert reloaded.translate(sentences, beam=5) == in_memory.translate(sentences, beam=5)
