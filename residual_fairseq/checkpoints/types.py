"""A checkpoint's config values have the types its config declares (part of check 4).

fairseq hands a stored config to the model, task and optimizer as it is: a checkpoint
whose ``cfg.model.dropout`` is ``"abc"`` loaded, and failed later, far from the file
(a TypeError while decoding, or fairseq-generate aborting). So every stored value of
an option declared as a number, an integer, a bool, a string or a list of those must
be one. The declarations: the sections of ``FairseqConfig`` (``common``,
``dataset``...); the model's dataclass where fairseq registers one (nested
``encoder``/``decoder`` included), else the options its ``add_args`` declares (the
transformer family, this plugin's models; a number parser such as a positive-integer
check counts as the type it returns); and the dataclasses of the stored task,
criterion, optimizer, learning-rate scheduler, bpe, tokenizer and scorer. A flat
config (``args``, or the ``cfg.model`` Namespace of a CLI-trained checkpoint) is
checked against all of them by option name (a name they declare differently is not
checked). Options typed ``Any``, enums and undeclared options are not checked.

What is accepted is what fairseq's own checkpoints hold: an int where a float is
declared, ``None`` for any option (unset; fairseq's own configs hold it where the
declaration says otherwise, e.g. a language model's ``max_target_positions`` under a
translation task's declaration), a list (or
one element) where a list is declared, ``"True"``/``"False"`` for a bool (older
fairseq stored ``left_pad_source`` so), and an option's own default as it is (a few
of fairseq's do not fit their declared type).
"""
import argparse
import dataclasses
import functools
import typing

from .errors import CheckpointError
from .options import config_option

# Sections of fairseq's config that name their dataclass with ``_name``, and the
# registry (fairseq.registry.REGISTRIES) that holds it.
REGISTERED_SECTIONS = ("criterion", "optimizer", "lr_scheduler", "bpe", "tokenizer", "scoring")


def _hints(dataclass) -> dict:
    try:
        return typing.get_type_hints(dataclass)
    except Exception:  # noqa: BLE001  an annotation that does not resolve: the declared objects
        return {field.name: field.type for field in dataclasses.fields(dataclass)}


@functools.lru_cache(maxsize=None)
def _field_types(dataclass) -> dict:
    """{field: (type, default)} of a config dataclass."""
    hints = _hints(dataclass)
    types = {}
    for field in dataclasses.fields(dataclass):
        if not field.name.startswith("_"):
            default = field.default if field.default is not dataclasses.MISSING else _NO_DEFAULT
            types[field.name] = (hints.get(field.name, field.type), default)
    return types


_NO_DEFAULT = object()


def _option_types(add_args) -> dict:
    """{option: (type, default)} of the options a model declares with ``add_args(parser)``
    (fairseq's transformer family declares its dataclass's fields so, without registering it)."""
    parser = argparse.ArgumentParser(add_help=False, conflict_handler="resolve")
    try:
        add_args(parser)
    except Exception:  # noqa: BLE001  a model whose options cannot be listed: none checked
        return {}
    types = {}
    for action in parser._actions:
        if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
            types[action.dest] = (bool, action.default)
        elif type(action) is argparse._StoreAction and action.nargs is None and action.type is not None:
            kind = action.type if action.type in (int, float, str) else _parsed_type(action.type)
            if kind is not None:
                types[action.dest] = (kind, action.default)
    return types


def _parsed_type(parse):
    """int or float, when a number parser (``--encoder-layers``' positive integers) gives one for "1"."""
    try:
        value = parse("1")
    except Exception:  # noqa: BLE001  not a number parser
        return None
    return type(value) if type(value) in (int, float) else None


def _fairseq_sections() -> dict:
    from fairseq.dataclass.configs import FairseqConfig

    hints = _hints(FairseqConfig)
    return {name: kind for name, kind in hints.items() if dataclasses.is_dataclass(kind)}


@functools.lru_cache(maxsize=None)
def _model_types(arch) -> dict:
    """{option: (type, default)} of the model that ``arch`` names (an architecture or a model)."""
    from fairseq.models import ARCH_MODEL_NAME_REGISTRY, MODEL_DATACLASS_REGISTRY, MODEL_REGISTRY

    name = ARCH_MODEL_NAME_REGISTRY.get(arch, arch)
    if name in MODEL_DATACLASS_REGISTRY:
        return _field_types(MODEL_DATACLASS_REGISTRY[name])
    model = MODEL_REGISTRY.get(name)
    return _option_types(model.add_args) if hasattr(model, "add_args") else {}


def _registered_dataclass(section, name):
    if not isinstance(name, str):
        return None
    if section == "task":
        from fairseq.tasks import TASK_DATACLASS_REGISTRY

        return TASK_DATACLASS_REGISTRY.get(name)
    from fairseq.registry import REGISTRIES

    return REGISTRIES.get(section, {}).get("dataclass_registry", {}).get(name)


def _describe(kind) -> str:
    origin = typing.get_origin(kind)
    if origin is typing.Union:
        return " or ".join(_describe(k) for k in typing.get_args(kind) if k is not type(None))
    if origin in (list, tuple):
        args = [a for a in typing.get_args(kind) if a is not Ellipsis]
        plural = {float: "numbers", int: "integers", bool: "True/False values", str: "strings"}
        return f"a list of {plural.get(args[0], 'values')}" if args else "a list"
    return {float: "a number", int: "an integer", bool: "True or False", str: "a string"}.get(kind, str(kind))


def _fits(value, kind) -> typing.Optional[bool]:
    """True/False: whether ``value`` has the declared type; None: the type is not checked."""
    if value is None:
        return True  # an option left unset: fairseq's configs hold None for those, typed or not
    origin = typing.get_origin(kind)
    if origin is typing.Union:
        verdicts = [_fits(value, k) for k in typing.get_args(kind) if k is not type(None)]
        return None if any(v is None for v in verdicts) else any(verdicts)
    if origin in (list, tuple):
        args = [a for a in typing.get_args(kind) if a is not Ellipsis]
        element = args[0] if len(set(args)) == 1 else None
        if element not in (float, int, bool, str):
            return None
        items = value if isinstance(value, (list, tuple)) else [value]
        return all(_fits(item, element) for item in items)
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind is bool:
        return isinstance(value, bool) or value in ("True", "False")
    if kind is str:
        return isinstance(value, str)
    return None


def _items(config):
    if isinstance(config, argparse.Namespace):
        return vars(config).items()
    return config.items() if isinstance(config, dict) else ()


def _check(config, types, where, path, nested=None):
    """Check the options of ``config`` that ``types`` declares; recurse into dataclass-typed fields."""
    for key, value in _items(config):
        if key not in types:
            continue
        kind, default = types[key]
        if dataclasses.is_dataclass(kind):
            if isinstance(value, (dict, argparse.Namespace)):
                _check(value, _field_types(kind), f"{where}.{key}", path)
            continue
        if value is default or (type(value) is type(default) and value == default):
            continue  # fairseq's own default (a few do not fit their declared type: "???", '2' for an int)
        if _fits(value, kind) is False:
            shown = repr(value)
            shown = shown if len(shown) <= 40 else shown[:40] + "..."
            raise CheckpointError(f"checkpoint {path} stores {where}.{key} = {shown}, not {_describe(kind)} "
                                  "(a damaged or hand-edited config)")


def _merged(dataclasses_in_order) -> dict:
    """{field: (type, default)} over several dataclasses' ``_field_types`` (a flat config); a name they declare differently is left out."""
    merged, ambiguous = {}, set()
    for types in dataclasses_in_order:
        for name, declared in types.items():
            if name in merged and merged[name][0] != declared[0]:
                ambiguous.add(name)
            merged.setdefault(name, declared)
    for name in ambiguous:
        merged.pop(name)
    return merged


def check_config_types(state, path, arch) -> None:
    """Raise :class:`CheckpointError` naming the option if a stored config value has
    another type than its dataclass field (see the module's docstring)."""
    sections = _fairseq_sections()
    model_types = _model_types(arch) if isinstance(arch, str) else {}
    args, cfg = state.get("args"), state.get("cfg")
    flat = args
    if cfg is not None and args is None:
        for section, config in cfg.items():
            if section in sections:
                _check(config, _field_types(sections[section]), f"cfg.{section}", path)
            elif section == "model" and isinstance(config, argparse.Namespace):
                flat = config  # a CLI-trained checkpoint: the training arguments, flat
            elif section == "model":
                _check(config, model_types, "cfg.model", path)
            elif section == "task" or section in REGISTERED_SECTIONS:
                dataclass = _registered_dataclass(section, config_option(config, "_name"))
                if dataclass is not None:
                    _check(config, _field_types(dataclass), f"cfg.{section}", path)
    if flat is None:
        return
    named = [_registered_dataclass(section, config_option(flat, section)) for section in ("task", *REGISTERED_SECTIONS)]
    types = _merged([model_types, *(_field_types(d) for d in named if d is not None),
                     *(_field_types(d) for d in sections.values())])
    _check(flat, types, "args" if flat is args else "cfg.model", path)
