"""An evaluation's output files: their names, the staged commit that writes them all or none, and cleanup.

An evaluation writes ``<out>.json`` and, under its name less a final ``.json``, the
``.hyp.txt``, ``.generate.txt`` (+ ``.log``) and, when averaging, ``.averaged.pt`` side
files. They are first written as ``<file>.partial-<pid>`` and moved into place together
once the whole run has succeeded, so a failed run leaves an earlier result intact; what a
killed run left is removed by the next run on the same outputs. That no output is one of
the run's inputs is checked by :mod:`residual_fairseq.run_inputs` before anything is written.
"""
import contextlib
import glob
import json
import re
from pathlib import Path

from ..atomic import atomic_output, process_alive


def default_result_name(subset, checkpoint_file=None, last_n=None, update_based=False, kind="eval") -> str:
    """``eval-<subset>.json`` for checkpoint_best.pt, ``eval-<subset>-<checkpoint>.json`` for any other
    file (``eval-test-checkpoint33.json``), ``eval-<subset>-avg<N>[-updates].json`` for an average."""
    if last_n:
        tag = f"-avg{last_n}" + ("-updates" if update_based else "")
    elif checkpoint_file is None or Path(checkpoint_file).name == "checkpoint_best.pt":
        tag = ""
    else:
        name = Path(checkpoint_file).name
        tag = "-" + (name[:-3] if name.endswith(".pt") and len(name) > 3 else name)
    return f"{kind}-{subset}{tag}.json"


def result_stem(out_json) -> Path:
    """``out_json`` less a final ``.json`` only: ``lp/eval-lenpen0.6`` keeps its ``.6``."""
    out_json = Path(out_json)
    name = out_json.name
    if name.lower().endswith(".json") and len(name) > len(".json"):
        return out_json.with_name(name[:-len(".json")])
    return out_json


def result_files(out_json, averaged: bool = False) -> dict:
    """Every file an evaluation writes under ``out_json``'s name, by role."""
    out_json = Path(out_json)
    stem = str(result_stem(out_json))
    files = {
        "result": out_json,
        "hypotheses": Path(f"{stem}.hyp.txt"),
        "generate_output": Path(f"{stem}.generate.txt"),
        "generate_log": Path(f"{stem}.generate.txt.log"),
        "failed_output": Path(f"{stem}.generate.failed.txt"),
        "failed_log": Path(f"{stem}.generate.failed.txt.log"),
    }
    if averaged:
        files["averaged"] = Path(f"{stem}.averaged.pt")
    return files



def remove_abandoned_staging(outputs) -> None:
    """Remove what an evaluation of the same outputs left when it was killed (SIGKILL, or SIGTERM,
    which ends Python without cleanup): ``OUT.partial-PID`` and its temporaries, for a PID that
    no longer runs. Nothing else is touched."""
    for output in map(Path, outputs):
        name = re.compile(rf"\.?{re.escape(output.name)}\.partial-(\d+)(\..+\.tmp)?")
        for entry in output.parent.glob(f"*{glob.escape(output.name)}.partial-*"):
            match = name.fullmatch(entry.name)
            if match and entry.is_file() and not entry.is_symlink() and not process_alive(int(match[1])):
                with contextlib.suppress(OSError):
                    entry.unlink()


def write_json(result, path):
    with atomic_output(path) as tmp, open(tmp, "w", encoding="utf-8") as out:
        json.dump(result, out, indent=2, ensure_ascii=False)
        out.write("\n")
