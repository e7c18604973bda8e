"""The ``slow`` marker, kept honest: what makes a test slow, and a guard that fails a fast test
which starts a process.

A test is slow when it trains a model or starts another process (a subprocess, a console
script, a multiprocessing pool). It says so with ``@pytest.mark.slow`` (or a module's
``pytestmark``); a test that uses one of SLOW_FIXTURES, directly or through another fixture,
is marked here. ``python -m pytest -m "not slow"`` is the quick loop (docs/development.md).

While a test that is not marked slow sets up, runs and tears down, every way of starting a
process raises, and the test fails naming what it tried to start, even where the code under
test catches the error. So the fast subset cannot quietly grow a training run.
"""
import multiprocessing.util
import os
import platform
import subprocess
import sys

import pytest

# Fixtures that train a model (or prepare data by training a subword model) or start
# processes. Matched by name: a fixture of the same name elsewhere is marked slow too.
SLOW_FIXTURES = {
    "trained_tiny",      # conftest.py: fairseq-train, 300 updates
    "sample_prepared",   # helpers/fixtures_training.py: sentencepiece + binarization of the sample (minutes under load)
    "toy_run",           # tools/test_evaluate.py, tools/test_translate.py: helpers.trained_models.toy_evaluation
    "toy_lm",            # tools/test_lm_cli.py: prepare + fairseq-train of a tiny language model
    "real",              # checkpoints/test_untrusted_checkpoints.py: fairseq-train of the checkpoint every case derives from
    "es_en_checkpoint",  # tools/test_finetune.py: a model trained on the sample
}


def pytest_sessionstart(session):
    # platform.platform() (the benchmark's machine record) runs `uname -p` once per process
    # and caches it: run it here, so no test depends on being the first to ask.
    platform.platform()


@pytest.hookimpl(tryfirst=True)  # before -m deselects
def pytest_collection_modifyitems(items):
    for item in items:
        if SLOW_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


class ProcessInFastTest(RuntimeError):
    """A test not marked slow tried to start a process."""


def _forbid_processes(started):
    """Make every way of starting a process record itself in ``started`` and raise;
    returns the function that undoes it."""
    def refuse(label, original):
        def refused(*args, **kwargs):
            shown = args[1] if label == "subprocess.Popen" and len(args) > 1 else kwargs.get("args", args)
            started.append(f"{label}({shown!r:.200})")
            raise ProcessInFastTest(f"{label} in a test not marked slow (docs/development.md)")
        # Pickled by reference as the original (a test pickles os.system into a crafted checkpoint).
        refused.__module__, refused.__name__ = original.__module__, original.__name__
        refused.__qualname__ = original.__qualname__
        return refused

    patches = [(subprocess.Popen, "__init__"), (multiprocessing.util, "spawnv_passfds")]
    patches += [(os, name) for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system")
                if hasattr(os, name)]
    # os's functions are posix's: patch the module pickle names them by as well.
    patches += [(sys.modules[getattr(os, name).__module__], name) for owner, name in list(patches)
                if owner is os and getattr(os, name).__module__ != "os"]
    saved = [(owner, name, getattr(owner, name)) for owner, name in patches]
    replacements = {}
    for owner, name, original in saved:
        label = "subprocess.Popen" if owner is subprocess.Popen else f"{getattr(owner, '__name__', owner)}.{name}"
        if id(original) not in replacements:
            replacements[id(original)] = refuse(label, original)
        setattr(owner, name, replacements[id(original)])

    def undo():
        for owner, name, original in saved:
            setattr(owner, name, original)
    return undo


def _guarded(item):
    if item.get_closest_marker("slow"):
        return (yield)
    started = []
    undo = _forbid_processes(started)
    try:
        return (yield)
    finally:
        undo()
        if started:
            pytest.fail(f"{item.nodeid} is not marked slow but started a process: {started[0]}"
                        " (mark it @pytest.mark.slow; docs/development.md)", pytrace=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    return (yield from _guarded(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    return (yield from _guarded(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    return (yield from _guarded(item))
