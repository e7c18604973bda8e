"""Files the project ships beside its code: the configs and the sample corpus.

In a checkout they live at the repository root (``configs/``, ``data/sample-es-en/``);
a built wheel carries copies inside the package (see setup.py's build step), so an
installed copy needs no checkout.
"""
from pathlib import Path

from .errors import UserError

PACKAGE_DIR = Path(__file__).resolve().parent

# name inside the installed package -> path in a checkout, relative to the repo root
SHIPPED = {
    "configs": "configs",
    "sample-es-en": "data/sample-es-en",
}


def shipped_dir(name: str) -> Path:
    """The directory of a shipped resource, installed copy first, then the checkout."""
    for candidate in (PACKAGE_DIR / name, PACKAGE_DIR.parent / SHIPPED[name]):
        if candidate.is_dir():
            return candidate
    raise UserError(f"{name} not found in {PACKAGE_DIR} nor in a checkout around it")
