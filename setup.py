"""residual-fairseq: the ResiDual transformer (Xie et al., 2023) as a fairseq plugin.

torch is deliberately *not* pinned here: pip keeps whatever torch the user already
has. On a machine without torch, install one first (see README: Install).
"""
import shutil
from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

# Shipped inside the package (see residual_fairseq/resources.py): the hydra configs
# and the sample corpus live at the repository root, and a wheel carries copies.
SHIPPED = {"configs": "configs", "sample-es-en": "data/sample-es-en"}


class BuildWithShippedFiles(build_py):
    def run(self):
        super().run()
        for name, source in SHIPPED.items():
            target = Path(self.build_lib) / "residual_fairseq" / name
            shutil.copytree(source, target, dirs_exist_ok=True)

# ve-fairseq ships ready-made wheels of upstream fairseq for CPython 3.11/3.12 on
# Linux x86_64; everywhere else fairseq-fixed builds the same code from source.
# (PEP 508 markers have no "not", hence the second marker spelled out.)
WHEEL_PLATFORM = (
    "platform_system == 'Linux' and platform_machine == 'x86_64'"
    " and python_version >= '3.11' and python_version < '3.13'"
)
OTHER_PLATFORMS = (
    "platform_system != 'Linux' or platform_machine != 'x86_64'"
    " or python_version < '3.11' or python_version >= '3.13'"
)

setup(
    name="residual-fairseq",
    version="0.1.0",
    description="ResiDual (Pre-Post-LN) transformer as a fairseq plugin",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="MIT",
    python_requires=">=3.9",
    packages=find_packages(include=["residual_fairseq", "residual_fairseq.*"]),
    cmdclass={"build_py": BuildWithShippedFiles},
    install_requires=[
        f"ve-fairseq==0.12.3; {WHEEL_PLATFORM}",
        f"fairseq-fixed==0.12.3.1; {OTHER_PLATFORMS}",
        "numpy",
        "sacrebleu>=2.0",
        "sacremoses",
        "sentencepiece",
        "subword-nmt",
        "matplotlib",
        "tqdm",
        "scipy",                 # reproduce's seed-noise test (Welch's t); fairseq already pulls it in via scikit-learn
        "tensorboardX>=2.6",     # fairseq-train --tensorboard-logdir (fairseq prints "Please install tensorboardX" without it)
    ],
    extras_require={"test": ["pytest"]},
    entry_points={
        "console_scripts": [
            "residual-fairseq-prepare = residual_fairseq.data.cli:main",
            "residual-fairseq-train = residual_fairseq.train:main",
            "residual-fairseq-evaluate = residual_fairseq.evaluate:main",
            "residual-fairseq-average-checkpoints = residual_fairseq.average_checkpoints:main",
            "residual-fairseq-convert = residual_fairseq.convert:main",
            "residual-fairseq-reproduce = residual_fairseq.reproduce:main",
            "residual-fairseq-best-lr = residual_fairseq.reproduce.best_lr:main",
            "residual-fairseq-finetune = residual_fairseq.finetune:main",
            "residual-fairseq-translate = residual_fairseq.translate:main",
            "residual-fairseq-analyze = residual_fairseq.analysis:main",
            "residual-fairseq-benchmark = residual_fairseq.benchmark:main",
        ]
    },
)
