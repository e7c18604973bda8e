"""Config strings are data: the plugin's literal-only replacement for fairseq's ``eval()``.

fairseq 0.12.3 passes some string options to Python's builtin ``eval()`` while it
builds a model, a task or an optimizer: ``fairseq.utils.eval_str_list`` (e.g.
``--adaptive-softmax-cutoff 1000,5000``), ``eval_str_dict``, ``eval_bool``, and bare
``eval(cfg.x)`` calls in fconv, lightconv, transformer_lm, wav2vec, hubert, the
optimizers (``--adam-betas``) and a few datasets. For a checkpoint those strings come
from the file, so loading a crafted checkpoint ran its code even with weights-only
unpickling.

:func:`close_fairseq_eval_calls` gives every fairseq module that calls the builtin
``eval`` a module-level ``eval`` of its own, :func:`literal_only_eval`: Python finds a
module global before a builtin, so fairseq's functions (and every module that
imported ``eval_str_list`` & co. by name, since those keep their home module's
globals) now evaluate literals only. The legitimate forms keep their meaning:
``"1000,5000"``, ``"[1000, 5000]"``, ``"(0.9, 0.98)"``, ``"True"``, ``"{'a': 1}"`` and
fairseq's list defaults built with ``+`` and ``*`` such as ``"[(512, 3)] * 20"``.
Anything else (a name, a call, an attribute, a comprehension...) raises
:class:`CodeInConfigError` instead of running.

:func:`check_config_strings` is the early check: the fields fairseq evaluates, read
from a checkpoint's stored config, must parse as literals before any model is built,
so the error names the field.
"""
import argparse
import ast
import dis
import sys
import types

from ..errors import UserError

# A config string longer than this is not an option value.
MAX_SOURCE_CHARS = 100_000
# Longest list/tuple/str that ``+`` and ``*`` may build ("[0] * 10**12" would be a memory bomb).
MAX_SEQUENCE_LENGTH = 100_000

# Every option that fairseq 0.12.3 (outside examples/) passes to eval(), eval_str_list,
# eval_str_dict or eval_bool (found by reading its source; see docs/reliability.md).
EVALUATED_FIELDS = frozenset({
    "adaptive_softmax_cutoff", "adaptive_input_cutoff", "character_filters",        # transformer(_lm), lstm, lightconv
    "xformers_att_config", "encoder_xformers_att_config", "decoder_xformers_att_config",  # multihead attention
    "encoder_layers", "decoder_layers", "encoder_attention", "decoder_attention",    # fconv, fconv_self_att, lstm
    "self_attention", "project_input", "gated_attention", "downsample", "pretrained",
    "conv_feature_layers", "conv_aggregator_layers", "override_encoder_layers",     # wav2vec, hubert, s2t
    "pipeline_balance", "pipeline_devices", "pipeline_encoder_balance",            # model parallel
    "pipeline_encoder_devices", "pipeline_decoder_balance", "pipeline_decoder_devices",
    "adam_betas", "adamax_betas", "adafactor_eps", "lamb_betas",                   # optimizers
    "wer_args", "left_pad_source", "left_pad_target", "model_overrides",          # ctc, multilingual tasks, CLIs
    "lang_tok_replacing_bos_eos", "langtoks", "langtoks_specs", "sampling_weights",
})


class CodeInConfigError(UserError):
    """A config string that fairseq would evaluate is not a literal."""


def _preview(text, limit=60):
    text = str(text)
    return text if len(text) <= limit else text[:limit] + "..."


def _refuse(text, why):
    raise CodeInConfigError(
        f"refusing to evaluate config string {_preview(text)!r} ({why}): fairseq runs such strings as Python "
        "code; only literals (numbers, strings, lists, tuples, dicts, True/False/None, with + and *) are accepted"
    )


def literal_value(text: str):
    """The value of a literal config string; :class:`CodeInConfigError` for anything else."""
    if len(text) > MAX_SOURCE_CHARS:
        _refuse(text, f"longer than {MAX_SOURCE_CHARS} characters")
    try:
        tree = ast.parse(text.strip(), mode="eval")
        return _evaluate(tree.body, text)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as err:
        _refuse(text, f"not a literal: {type(err).__name__}")


def _sized(value, text):
    if isinstance(value, (list, tuple, str, bytes)) and len(value) > MAX_SEQUENCE_LENGTH:
        _refuse(text, f"builds a sequence longer than {MAX_SEQUENCE_LENGTH}")
    return value


def _evaluate(node, text):
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        items = [_evaluate(element, text) for element in node.elts]
        return {ast.Tuple: tuple, ast.List: list, ast.Set: set}[type(node)](items)
    if isinstance(node, ast.Dict):
        if any(key is None for key in node.keys):
            _refuse(text, "** in a dict")
        return {_evaluate(k, text): _evaluate(v, text) for k, v in zip(node.keys, node.values)}
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        operand = _evaluate(node.operand, text)
        if not isinstance(operand, (int, float, complex)) or isinstance(operand, bool):
            _refuse(text, "sign of a non-number")
        return -operand if isinstance(node.op, ast.USub) else +operand
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult)):
        left, right = _evaluate(node.left, text), _evaluate(node.right, text)
        numbers = (int, float, complex)
        if isinstance(node.op, ast.Mult) and isinstance(left, int) and not isinstance(right, numbers):
            left, right = right, left  # 20 * [x] -> [x] * 20
        if isinstance(left, numbers) and isinstance(right, numbers):
            if isinstance(node.op, ast.Mult) and isinstance(left, int) and isinstance(right, int) \
                    and left.bit_length() + right.bit_length() > 4096:
                _refuse(text, "number too large")
            return _sized({ast.Add: lambda: left + right, ast.Sub: lambda: left - right,
                           ast.Mult: lambda: left * right}[type(node.op)](), text)
        sequences = (list, tuple, str, bytes)
        if isinstance(node.op, ast.Add) and isinstance(left, sequences) and type(left) is type(right):
            return _sized(left + right, text)
        if isinstance(node.op, ast.Mult) and isinstance(left, sequences) and isinstance(right, int) \
                and not isinstance(right, bool):
            if len(left) * max(right, 0) > MAX_SEQUENCE_LENGTH:
                _refuse(text, f"builds a sequence longer than {MAX_SEQUENCE_LENGTH}")
            return left * right
        _refuse(text, f"unsupported operands for {type(node.op).__name__}")
    if isinstance(node, (ast.BinOp, ast.UnaryOp)):
        _refuse(text, f"contains the operator {type(node.op).__name__}")
    _refuse(text, f"contains {type(node).__name__}")


def literal_only_eval(source, globals=None, locals=None):  # noqa: A002  (eval's own signature)
    """What fairseq's modules get as ``eval``: literals only, otherwise like the builtin.

    Non-strings raise ``TypeError`` as the builtin does (``fairseq.utils.eval_bool``
    relies on that); code objects are refused.
    """
    if isinstance(source, bytes):
        source = source.decode("utf-8")
    if isinstance(source, types.CodeType):
        raise CodeInConfigError("refusing to evaluate a code object (fairseq config values are strings)")
    if not isinstance(source, str):
        raise TypeError("eval() arg 1 must be a string, bytes or code object")
    return literal_value(source)


def _calls_builtin_eval(code) -> bool:
    if "eval" in code.co_names and any(
        ins.opname in ("LOAD_GLOBAL", "LOAD_NAME") and ins.argval == "eval" for ins in dis.get_instructions(code)
    ):
        return True
    return any(_calls_builtin_eval(const) for const in code.co_consts if isinstance(const, types.CodeType))


_scanned = {}  # module name -> module object already handled


def close_fairseq_eval_calls() -> list:
    """Give every loaded fairseq module that calls the builtin ``eval`` the literal-only one.

    Safe to call repeatedly (it only looks at modules imported since the last call);
    returns the names of the modules patched by this call. A module that defines its
    own ``eval`` is left alone.
    """
    patched = []
    for name, module in list(sys.modules.items()):
        if module is None or _scanned.get(name) is module:
            continue
        if name.split(".")[0] not in ("fairseq", "fairseq_cli"):
            continue
        _scanned[name] = module
        own = vars(module).get("eval")
        if own is literal_only_eval or (own is not None and own is not eval):
            continue
        spec = getattr(module, "__spec__", None)
        try:
            code = spec.loader.get_code(name) if spec is not None and hasattr(spec.loader, "get_code") else None
        except (ImportError, OSError, SyntaxError):
            code = None
        if code is not None and _calls_builtin_eval(code):
            module.eval = literal_only_eval
            patched.append(name)
    return patched


def check_config_strings(config, where: str) -> None:
    """Raise :class:`CodeInConfigError` naming the field if a string option that fairseq
    evaluates is not a literal, anywhere in ``config`` (dicts and ``argparse.Namespace``
    objects, nested)."""
    stack = [(config, where)]
    while stack:
        node, path = stack.pop()
        items = vars(node).items() if isinstance(node, argparse.Namespace) else (
            node.items() if isinstance(node, dict) else ())
        for key, value in items:
            if isinstance(value, (dict, argparse.Namespace)):
                stack.append((value, f"{path}.{key}"))
            elif key in EVALUATED_FIELDS and isinstance(value, str):
                try:
                    literal_value(value)
                except CodeInConfigError as err:
                    raise CodeInConfigError(f"{path}.{key}: {err}") from None
