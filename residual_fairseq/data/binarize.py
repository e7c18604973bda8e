"""Binarization with fairseq's own ``fairseq-preprocess`` (run in-process)."""
import logging
from pathlib import Path

from .errors import DataPreparationError

logger = logging.getLogger(__name__)


def preprocess_arguments(source_lang, target_lang, text_dir, dest_dir, splits, joined_dictionary=True,
                         srcdict=None, tgtdict=None, workers=1):
    """The ``fairseq-preprocess`` command line for the text files ``text_dir/<split>.<lang>``.

    ``splits`` maps fairseq's split names to the text prefixes: 'train', 'valid'
    and any number of test sets, which fairseq names test, test1, test2, ...
    """
    text_dir = Path(text_dir)
    tests = sorted((name for name in splits if name.startswith("test")), key=_test_index)
    arguments = ["--source-lang", source_lang, "--target-lang", target_lang,
                 "--trainpref", str(text_dir / splits["train"]), "--destdir", str(dest_dir),
                 "--workers", str(max(1, workers))]
    if "valid" in splits:
        arguments += ["--validpref", str(text_dir / splits["valid"])]
    if tests:
        arguments += ["--testpref", ",".join(str(text_dir / splits[name]) for name in tests)]
    if srcdict and tgtdict:
        # Two given dictionaries are used as they are, joined or not.
        arguments += ["--srcdict", str(srcdict), "--tgtdict", str(tgtdict)]
    else:
        if joined_dictionary:
            arguments.append("--joined-dictionary")
        if srcdict:
            arguments += ["--srcdict", str(srcdict)]
        if tgtdict:
            arguments += ["--tgtdict", str(tgtdict)]
    return arguments


def _test_index(name):
    suffix = name[len("test"):]
    return int(suffix) if suffix else 0


def run_fairseq_preprocess(arguments):
    """Run fairseq_cli.preprocess with ``arguments`` in this process."""
    # Imported here: fairseq takes seconds to import and is needed only now.
    from fairseq import options
    from fairseq_cli import preprocess

    parser = options.get_preprocessing_parser()
    args = parser.parse_args(arguments)
    root = logging.getLogger()
    level = root.level
    try:
        preprocess.main(args)
    except (AssertionError, FileNotFoundError) as exc:
        raise DataPreparationError(f"fairseq-preprocess failed: {exc}") from None
    except BaseException as exc:
        # Interrupted (Ctrl-C, SIGTERM): fairseq never terminates its worker pools (--workers N),
        # whose processes could outlive us, so end the pools it started. (Terminating their
        # processes alone is not enough: a live pool replaces workers that exit.)
        for pool in _pools_in(exc.__traceback__):
            pool.terminate()
        raise
    finally:
        # fairseq lowers the root logger to DEBUG on import and INFO in preprocess.
        root.setLevel(level)
    logger.info("fairseq-preprocess %s", " ".join(arguments))


def _pools_in(traceback) -> list:
    """The multiprocessing pools held by the frames an exception passed through: those fairseq
    started in the interrupted call (each is a local of the function that waits on it)."""
    from multiprocessing.pool import Pool

    pools = []
    while traceback is not None:
        # type(), not isinstance(): isinstance asks a dead weakref proxy for its __class__, and raises
        pools += [value for value in traceback.tb_frame.f_locals.values() if issubclass(type(value), Pool)]
        traceback = traceback.tb_next
    return pools
