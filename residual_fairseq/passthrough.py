"""Extra flags handed on to a fairseq tool: reading them, and refusing the ones a driver sets itself.

The one parser of pass-through flags (those after a lone ``--``, or in
``--generate-args``): :func:`split_passthrough` separates them from a driver's own
arguments, :func:`flag_value` reads the value fairseq will see for a flag, and
:func:`refuse_flags` refuses a flag the driver sets itself.

A driver (``residual-fairseq-train``, ``-reproduce``, the language-model evaluation)
builds a fairseq command from its own options and appends the user's extra flags;
fairseq's argparse lets a later flag win. An extra flag that the driver sets itself
would therefore make fairseq do something other than what the driver prints, names
and records: such flags are refused here, in any spelling argparse accepts
(``--flag value``, ``--flag=value``; ``-s value``, ``-svalue`` for a short flag).
"""
import sys
from typing import Iterable, List, Optional, Sequence, Tuple

from .errors import UserError


def _matches(word: str, flag: str) -> bool:
    if flag.startswith("--"):
        name = word.partition("=")[0]
        return name.startswith("--") and name.replace("_", "-") == flag
    # a short flag (-s): "-s", "-s=en" or "-sen"
    return word.startswith(flag) and not word.startswith("--")


def find_flag(extra_args: Iterable[str], flags: Sequence[str]) -> Optional[str]:
    """The first flag of ``flags`` that ``extra_args`` gives (as spelled there), or None."""
    for word in extra_args:
        if not isinstance(word, str) or not word.startswith("-"):
            continue
        for flag in flags:
            if _matches(word, flag):
                return word.partition("=")[0] if word.startswith("--") else flag
    return None


def refuse_flags(extra_args: Iterable[str], flags: Sequence[str], where: str, error=UserError) -> None:
    """Raise ``error`` (one line) when ``extra_args`` give one of ``flags``.

    ``where`` names the extra flags and who sets the refused one, e.g.
    ``"after --: residual-fairseq-reproduce sets it itself"``.
    """
    given = find_flag(extra_args, flags)
    if given is not None:
        raise error(f"{given} {where}")


def split_passthrough(argv=None) -> Tuple[List[str], List[str]]:
    """(a driver's own arguments, the fairseq arguments after a lone ``--``); ``argv``
    defaults to the command line."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" in argv:
        index = argv.index("--")
        return argv[:index], argv[index + 1:]
    return argv, []


def flag_values(extra_args: Iterable[str], flag: str) -> List[Optional[str]]:
    """The value of each ``flag VALUE`` / ``flag=VALUE`` (a long flag, also spelled with
    ``_`` for ``-``) among ``extra_args``, in order; None where the flag ends the list."""
    extra, values = list(extra_args), []
    for index, word in enumerate(extra):
        if not isinstance(word, str) or not _matches(word, flag):
            continue
        name, equals, value = word.partition("=")
        values.append(value if equals else (extra[index + 1] if index + 1 < len(extra) else None))
    return values


def without_flags(extra_args: Iterable[str], flags: Sequence[str]) -> List[str]:
    """``extra_args`` without each ``flag VALUE`` / ``flag=VALUE`` of ``flags`` (long flags taking a value)."""
    extra, kept, skip = list(extra_args), [], False
    for word in extra:
        if skip:
            skip = False
            continue
        if isinstance(word, str) and any(_matches(word, flag) for flag in flags):
            skip = "=" not in word
            continue
        kept.append(word)
    return kept


def flag_value(extra_args: Iterable[str], flag: str) -> Optional[str]:
    """The value fairseq's argparse will see for ``flag`` (the last one given wins); None
    if it is not given a value."""
    given = [value for value in flag_values(extra_args, flag) if value is not None]
    return given[-1] if given else None


def flag_given(extra_args: Iterable[str], flag: str) -> bool:
    """Whether ``extra_args`` give ``flag`` (a switch such as ``--reset-meters``), in any spelling."""
    return find_flag(extra_args, (flag,)) is not None
