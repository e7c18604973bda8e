"""The plugin works from a wheel installed into a fresh virtual environment, with no checkout.

Slow (it installs torch and fairseq into the venv), but it is the only test of what
a user gets from ``pip install``: the dependency markers, the kept torch, the
package contents and the ``--user-dir "$(python -m residual_fairseq)"`` recipe.
"""
import sys

import pytest

from helpers import CLI_ENV, REPO, TINY_TRAIN_ARGS, run


pytestmark = pytest.mark.slow  # every test here installs into a venv and trains


def test_wheel_in_fresh_venv_trains_and_generates(toy_data_bin, tmp_path):
    venv = tmp_path / "venv"
    bin_dir = venv / "bin"
    run([sys.executable, "-m", "venv", venv])
    # A torch the user already has must be kept by the install below.
    run([bin_dir / "python", "-m", "pip", "install", "-q", "torch==2.13.0"])
    torch_before = run([bin_dir / "python", "-c", "import torch; print(torch.__version__)"]).stdout
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", tmp_path / "dist", REPO])
    [wheel] = (tmp_path / "dist").glob("residual_fairseq-*.whl")
    run([bin_dir / "python", "-m", "pip", "install", "-q", wheel])
    assert run([bin_dir / "python", "-c", "import torch; print(torch.__version__)"]).stdout == torch_before

    workdir = tmp_path / "elsewhere"  # no checkout on sys.path
    workdir.mkdir()
    env = {**CLI_ENV, "PYTHONPATH": ""}
    user_dir = run([bin_dir / "python", "-m", "residual_fairseq"], cwd=workdir, env=env).stdout.strip()
    assert user_dir.startswith(str(venv)), user_dir
    # The configs and the sample corpus ship inside the wheel.
    shipped = run([bin_dir / "python", "-c", (
        "from residual_fairseq.resources import shipped_dir as d; "
        "print(d('configs') / 'sample-es-en' / 'resi_dual-3l.yaml'); print(d('sample-es-en') / 'train.tsv.gz')"
    )], cwd=workdir, env=env).stdout.split()
    assert all(path.startswith(user_dir) for path in shipped), shipped
    dry_run = run([
        bin_dir / "residual-fairseq-train", "--dataset", "sample-es-en", "--variant", "resi_dual", "--layers", "3",
        "--data", toy_data_bin, "--save-dir", tmp_path / "dry", "--dry-run",
    ], cwd=workdir, env=env)
    assert "--arch resi_dual" in dry_run.stdout and user_dir in dry_run.stdout
    save_dir = tmp_path / "ckpt"
    run([
        bin_dir / "fairseq-train", toy_data_bin, "--user-dir", user_dir, *TINY_TRAIN_ARGS,
        "--max-update", "4", "--save-dir", save_dir,
    ], cwd=workdir, env=env)
    proc = run([
        bin_dir / "fairseq-generate", toy_data_bin, "--user-dir", user_dir, "--cpu", "--num-workers", "0",
        "--path", save_dir / "checkpoint_last.pt", "--max-sentences", "4", "--max-tokens", "200",
    ], cwd=workdir, env=env)
    assert "Generate test with beam=5" in proc.stdout + proc.stderr
