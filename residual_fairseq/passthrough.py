"""Extra flags handed on to a fairseq tool, and the ones a driver sets itself.

A driver (``residual-fairseq-train``, ``-reproduce``, the language-model evaluation)
builds a fairseq command from its own options and appends the user's extra flags;
fairseq's argparse lets a later flag win. An extra flag that the driver sets itself
would therefore make fairseq do something other than what the driver prints, names
and records: such flags are refused here, in any spelling argparse accepts
(``--flag value``, ``--flag=value``; ``-s value``, ``-svalue`` for a short flag).
"""
from typing import Iterable, Optional, Sequence

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
