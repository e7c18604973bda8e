"""Handing a verified checkpoint to fairseq: its loader's tail, the models, and model archives.

:func:`load_checkpoint_to_cpu` is what fairseq's ``checkpoint_utils.load_checkpoint_to_cpu``
becomes once the plugin is imported (:mod:`residual_fairseq.fairseq_patches`): the
file goes through :func:`~.read.read_checkpoint`, then :func:`prepare_for_fairseq`
does what fairseq's own tail does (overrides, omegaconf config, upgrade of old
formats), clears the options that only initialise weights from a file (the
checkpoint's weights replace what they would load) and checks that the config fits
the weights (:mod:`.sizes`). :func:`load_models` builds the models of one file for the
project's tools; :func:`load_archive_file` replaces fairseq's unfiltered extraction of
``from_pretrained`` model archives.
"""
import argparse
import os
from pathlib import Path

from ..errors import UserError
from .config_strings import close_fairseq_eval_calls
from .errors import CheckpointError, WeightsMismatchError
from .options import config_option, has_option, set_config_option
from .read import read_checkpoint
from .sizes import check_config_fits_weights

# Options a model reads only to initialise weights from a file, weights that a loaded
# checkpoint then replaces: a checkpoint never needs those files (and must not make a
# loader open a path it names, /dev/zero included). Each is set to what it means at
# load: no file, or for Admin's profile WEIGHTS_FROM_CHECKPOINT, which tells the model
# that its omegas are the checkpoint's (so it does not warn that they start at 1).
WEIGHTS_FROM_CHECKPOINT = "<weights from the checkpoint>"
INITIALISATION_FILE_OPTIONS = {"admin_profile": WEIGHTS_FROM_CHECKPOINT, "encoder_embed_path": None,
                               "decoder_embed_path": None}


def load_checkpoint_to_cpu(path, arg_overrides=None, load_on_all_ranks=False):
    """``fairseq.checkpoint_utils.load_checkpoint_to_cpu`` through :func:`read_checkpoint`.

    The tail is fairseq 0.12.3's own (overrides, omegaconf config, upgrade of old
    formats); only the opening of the file differs.
    """
    from fairseq.file_io import PathManager

    return prepare_for_fairseq(read_checkpoint(PathManager.get_local_path(path)), path, arg_overrides)


def prepare_for_fairseq(state, path, arg_overrides=None):
    """A :func:`read_checkpoint` state in the form fairseq's loader returns (what
    ``load_model_ensemble_and_task(state=...)`` expects)."""
    from fairseq import checkpoint_utils
    from omegaconf import OmegaConf

    close_fairseq_eval_calls()  # modules imported since the plugin (e.g. another --user-dir)
    _forget_initialisation_files(state)
    if state.get("args") is not None and arg_overrides is not None:
        for arg_name, arg_val in arg_overrides.items():
            setattr(state["args"], arg_name, arg_val)
    if state.get("cfg") is not None:
        state["cfg"] = OmegaConf.create(state["cfg"], flags={"allow_objects": True})
        if arg_overrides is not None:
            checkpoint_utils.overwrite_args_by_name(state["cfg"], arg_overrides)
    try:
        state = checkpoint_utils._upgrade_state_dict(state)
    except (KeyError, AttributeError, TypeError, ValueError, IndexError) as err:
        raise CheckpointError(f"checkpoint {path} is malformed: fairseq cannot upgrade it "
                              f"({type(err).__name__}: {str(err)[:80]})") from None
    check_config_fits_weights(state, path)
    return state



def _forget_initialisation_files(state):
    """Replace the :data:`INITIALISATION_FILE_OPTIONS` of a checkpoint's model config
    (flat, or nested as ``encoder.embed_path``), before the caller's overrides."""
    # --replace-unk PATH (an alignment dictionary) is a decoding choice of whoever decodes, not
    # of the checkpoint: a stored path (fairseq opens and parses it unchecked) is dropped.
    for config in (state.get("args"), config_option(state.get("cfg"), "generation")):
        if isinstance(config_option(config, "replace_unk"), str):
            set_config_option(config, "replace_unk", None)
    model_configs = [state.get("args"), config_option(state.get("cfg"), "model")]
    for config in model_configs:
        for name, at_load in INITIALISATION_FILE_OPTIONS.items():
            if has_option(config, name) and config_option(config, name) != at_load:
                set_config_option(config, name, at_load)
        for stack in ("encoder", "decoder"):
            nested = config_option(config, stack)
            if isinstance(nested, (dict, argparse.Namespace)) and config_option(nested, "embed_path") is not None:
                set_config_option(nested, "embed_path", None)



def load_archive_file(archive_file):
    """fairseq's ``file_utils.load_archive_file`` (``from_pretrained`` of a model archive), made safe:
    fairseq extracts every member unfiltered (``../`` escapes the temp dir) and then deletes the
    archive, replacing it by the extracted directory. Here members go through the data filter of
    :func:`residual_fairseq.data.download.extract_archive`, into a temp dir removed at exit, and the
    archive is left as it was."""
    import atexit
    import shutil
    import tempfile

    from fairseq import file_utils

    from ..data.download import extract_archive

    try:
        resolved = file_utils.cached_path(archive_file, cache_dir=None)  # (downloads a URL to fairseq's cache)
    except EnvironmentError:
        return None  # as fairseq: the caller reports the name it could not find
    if os.path.isdir(resolved):
        return resolved
    into = tempfile.mkdtemp(prefix="residual-fairseq-archive-")
    atexit.register(shutil.rmtree, into, True)
    extract_archive(resolved, into)
    top = os.path.commonpath([str(path) for path in Path(into).iterdir()] or [into])
    return top if os.path.isdir(top) else into



def load_models(path, task=None, arg_overrides=None, state=None):
    """(models, cfg, task) of one checkpoint file, opened once through :func:`read_checkpoint`
    (or from ``state``, what :func:`read_checkpoint` returned for ``path``).

    The path is never split on ``:`` (fairseq's ensemble syntax). Failures while
    fairseq builds the model from the checkpoint's config are one-line
    :class:`CheckpointError` s; a shape mismatch is a :class:`WeightsMismatchError`.
    """
    from fairseq import checkpoint_utils

    state = read_checkpoint(path) if state is None else state
    state = prepare_for_fairseq(state, path, arg_overrides)
    try:
        return checkpoint_utils.load_model_ensemble_and_task([str(path)], arg_overrides=arg_overrides,
                                                             task=task, state=state)
    except UserError:
        raise
    except RuntimeError as err:
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        mismatch = [line for line in lines if "size mismatch" in line]
        if mismatch:
            raise WeightsMismatchError(path, mismatch[0]) from None
        detail = " ".join(lines[:2])[:200] if lines else type(err).__name__
        raise CheckpointError(f"checkpoint {path}: its weights do not fit its model: {detail}") from None
    except Exception as err:  # a verified but nonsensical config fails anywhere in fairseq's builders
        first = str(err).strip().splitlines()[0][:160] if str(err).strip() else ""
        raise CheckpointError(f"checkpoint {path}: fairseq cannot build a model from its config "
                              f"({type(err).__name__}: {first})") from None

