"""The config must fit the weights: the model a checkpoint's config describes, measured on the meta device.

Where fairseq would build the model, its layer counts must be at most the stored
layers, and the model the config describes, built on the meta device (nothing
allocated), must have the stored shapes and at most about twice the stored
parameters (:func:`check_config_fits_weights`): otherwise a 10 MB file could ask for
hundreds of GB.
"""
import argparse
import contextlib
import copy
import functools
import logging
import threading
from types import SimpleNamespace

import torch

from .errors import CheckpointError
from .options import config_option

# A model may hold a little more than its stored weights (sinusoidal position tables,
# buffers), never many times more.
MAX_BUILT_PER_STORED_ELEMENT = 2
MAX_CHECKED_LAYERS = 1000  # deeper than any model this project (or fairseq's examples) builds
BUILT_ELEMENTS_SLACK = 1 << 24


class SizedDictionary:
    """Stands in for a fairseq Dictionary where only its size and padding index matter."""

    def __init__(self, size, pad=1):
        self.size, self.pad_index = size, pad

    def __len__(self):
        return self.size

    def pad(self):
        return self.pad_index


def _stored_layers(weights, stack) -> int:
    prefix = f"{stack}.layers."
    return len({name[len(prefix):].split(".", 1)[0] for name in weights if name.startswith(prefix)})


def check_layer_counts(model_cfg, weights, path) -> None:
    """Refuse a config asking for more encoder/decoder layers than the weights hold
    (building even empty layers costs time and memory per layer)."""
    for stack in ("encoder", "decoder"):
        asked = config_option(model_cfg, f"{stack}_layers")
        if asked is None:
            asked = config_option(config_option(model_cfg, stack), "layers")
        if not isinstance(asked, int) or isinstance(asked, bool):
            continue  # other models spell layers otherwise (fconv: a string); fairseq checks those
        stored = _stored_layers(weights, stack)
        # No "{stack}.layers.N" weights: a model that names its layers otherwise (fairseq's
        # lstm: encoder.lstm.weight_ih_l0); the meta build's element count bounds it, and
        # MAX_CHECKED_LAYERS bounds the build itself.
        if (stored and asked > stored) or asked > MAX_CHECKED_LAYERS:
            raise CheckpointError(f"checkpoint {path} is malformed: its config asks for {asked} "
                                  f"{stack} layers, its weights hold {stored}")


# Building on the meta device would initialise every weight and compute the sinusoidal
# position tables there, which torch does through its Python decompositions: the first
# such op imports torch._dynamo, 2-3 s per process (every fairseq-generate, resume,
# translate). The shapes need neither, so while *this thread* builds shapes, the public
# torch.nn.init functions and fairseq's sinusoidal table return their tensor untouched /
# empty. The wrappers are installed on the first check and do exactly what the originals
# do for every other caller and thread.
_building_shapes = threading.local()


def _unless_building_shapes(function, shapes_only):
    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        if getattr(_building_shapes, "active", False):
            return shapes_only(*args, **kwargs)
        return function(*args, **kwargs)

    wrapper.residual_fairseq_shapes_only = True
    return wrapper


def _install_shape_only_paths() -> None:
    for name in dir(torch.nn.init):
        function = getattr(torch.nn.init, name)
        if name.endswith("_") and not name.startswith("_") and callable(function) \
                and not getattr(function, "residual_fairseq_shapes_only", False):
            setattr(torch.nn.init, name, _unless_building_shapes(function, lambda tensor, *a, **k: tensor))


# fairseq's sinusoidal table is wrapped only while shapes are being built, and put back
# after: TorchScript compiles SinusoidalPositionalEmbedding.forward, which calls
# get_embedding, and a Python wrapper left on the class would make every later
# torch.jit.script of a model with sinusoidal positions fail.
_table_lock = threading.Lock()
_table_users = 0
_original_table = None


def _wrap_sinusoidal_table() -> None:
    global _table_users, _original_table
    from fairseq.modules.sinusoidal_positional_embedding import SinusoidalPositionalEmbedding

    with _table_lock:
        if _table_users == 0:
            _original_table = SinusoidalPositionalEmbedding.__dict__["get_embedding"]
            SinusoidalPositionalEmbedding.get_embedding = staticmethod(_unless_building_shapes(
                _original_table.__func__,
                lambda num_embeddings, embedding_dim, *a, **k: torch.empty(num_embeddings, embedding_dim)))
        _table_users += 1


def _unwrap_sinusoidal_table() -> None:
    global _table_users
    from fairseq.modules.sinusoidal_positional_embedding import SinusoidalPositionalEmbedding

    with _table_lock:
        _table_users -= 1
        if _table_users == 0:
            SinusoidalPositionalEmbedding.get_embedding = _original_table


@contextlib.contextmanager
def _shapes_only():
    _install_shape_only_paths()
    _wrap_sinusoidal_table()
    _building_shapes.active = True
    try:
        with torch.device("meta"):
            yield
    finally:
        _building_shapes.active = False
        _unwrap_sinusoidal_table()


def config_shapes(model_cfg, weights, path):
    """{name: shape} of the state of the model ``model_cfg`` describes, and the number
    of elements of all its tensors (parameters, buffers, tables such as the sinusoidal
    positions), built on the meta device: nothing is allocated. The dictionaries are
    sized from the stored embeddings. None when there are none to size them from.

    Raises :class:`CheckpointError` for too many layers (:func:`check_layer_counts`);
    fairseq's own errors while building pass through.
    """
    from fairseq import models

    check_layer_counts(model_cfg, weights, path)
    sizes = {stack: weights.get(f"{stack}.embed_tokens.weight") for stack in ("encoder", "decoder")}
    if not (isinstance(sizes["decoder"], torch.Tensor) and sizes["decoder"].dim() == 2):
        return None
    target = SizedDictionary(sizes["decoder"].shape[0])
    source = target
    if isinstance(sizes["encoder"], torch.Tensor) and sizes["encoder"].dim() == 2 \
            and sizes["encoder"].shape[0] != len(target):
        source = SizedDictionary(sizes["encoder"].shape[0])
    # One object for both sides when they match: --share-all-embeddings asks for a joined dictionary.
    task = SimpleNamespace(source_dictionary=source, target_dictionary=target,
                           dictionary=target, output_dictionary=target)
    config = argparse.Namespace(**vars(model_cfg)) if isinstance(model_cfg, argparse.Namespace) \
        else copy.deepcopy(model_cfg)  # builders fill in defaults: never in the caller's config
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)  # the real build says it all again
    try:
        with _shapes_only():
            model = models.build_model(config, task)
    finally:
        logging.disable(previous)
    shapes = {name: tuple(tensor.shape) for name, tensor in model.state_dict().items()}
    elements = 0
    for module in model.modules():
        tensors = {id(t): t for t in (*module.parameters(recurse=False), *module.buffers(recurse=False),
                                      *(v for v in vars(module).values() if isinstance(v, torch.Tensor)))}
        elements += sum(t.numel() for t in tensors.values())
    return shapes, elements


def check_config_fits_weights(state, path) -> None:
    """Raise :class:`CheckpointError` unless the model that fairseq will build from the
    (upgraded) state's config has the stored shapes and not many more elements."""
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    weights = state["model"]
    if "fsdp_metadata" in state:
        return  # sharded: each file holds part of the weights
    cfg = convert_namespace_to_omegaconf(state["args"]) if state.get("args") is not None else state["cfg"]
    try:
        built = config_shapes(cfg.model, weights, path)
    except CheckpointError:
        raise
    except Exception:  # noqa: BLE001  the real build will fail the same way and say so
        return
    if built is None:
        return
    shapes, elements = built
    wrong = [name for name in shapes if name in weights and tuple(weights[name].shape) != shapes[name]]
    if wrong:
        name = wrong[0]
        raise CheckpointError(f"checkpoint {path} is malformed: its config makes {name} "
                              f"{list(shapes[name])}, its weights hold {list(weights[name].shape)}")
    stored = sum(tensor.numel() for tensor in weights.values())
    if elements > MAX_BUILT_PER_STORED_ELEMENT * stored + BUILT_ELEMENTS_SLACK:
        raise CheckpointError(f"refusing to load checkpoint {path}: its config asks for a model of "
                              f"{elements:,} values, its weights hold {stored:,}")

