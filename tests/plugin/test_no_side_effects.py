"""Importing the plugin leaves fairseq unchanged for models that are not the plugin's."""
import json
import sys

import pytest

from helpers import REPO, run


pytestmark = pytest.mark.slow  # every test here compares subprocesses

PROBE = r"""
import json, sys, torch
if sys.argv[1] == "with_plugin":
    import residual_fairseq  # noqa: F401
from fairseq import options, tasks
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.models import ARCH_MODEL_REGISTRY

parser = options.get_training_parser()
args = options.parse_args_and_arch(parser, [sys.argv[2], "--arch", "transformer_tiny", "--cpu", "--share-all-embeddings"])
cfg = convert_namespace_to_omegaconf(args)
task = tasks.setup_task(cfg.task)
torch.manual_seed(0)
model = task.build_model(cfg.model).eval()
src = torch.tensor([[5, 6, 7, 8, 2]])
out, _ = model(src, torch.tensor([5]), torch.tensor([[2, 5, 6]]))
print(json.dumps({
    "archs": sorted(a for a in ARCH_MODEL_REGISTRY if not a.startswith(("resi_dual", "deepnet", "admin", "b2t"))),
    "model_args": {k: repr(v) for k, v in sorted(vars(args).items()) if k != "user_dir"},
    "modules": [type(m).__module__ + "." + type(m).__name__ for m in model.modules()],
    "output": out.flatten().tolist(),
}))
"""


def probe(mode, data_bin):
    proc = run([sys.executable, "-c", PROBE, mode, data_bin], cwd=REPO)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_stock_transformer_is_unchanged_by_the_plugin(toy_data_bin):
    without, with_plugin = probe("without", toy_data_bin), probe("with_plugin", toy_data_bin)
    assert with_plugin["archs"] == without["archs"]
    assert with_plugin["model_args"] == without["model_args"]
    assert with_plugin["modules"] == without["modules"]
    assert with_plugin["output"] == without["output"]  # bit-identical
