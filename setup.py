"""Packaging hook (everything else is in pyproject.toml): the top-level ``configs/`` ship inside the wheel.

The Hydra configs live at the top of the repository, beside the package, where a checkout edits them. A wheel
copies them into ``canonical_network/configs/``, from where an installed ``cn-train`` composes
(``canonical_network.utils.config.CONFIG_DIR``). Copied here rather than declared as package data of a
``canonical_network.configs`` package mapped onto ``configs/`` (``package-dir``): that needs every package
listed by hand and makes setuptools warn once per config folder. ``configs/local/`` (git-ignored site
settings: Slurm account, W&B entity) is never shipped. An editable install reads ``configs/`` in place.

``data/README.md`` (how to get the real datasets by hand) ships as ``canonical_network/data/README.md``, so that
the data modules' error messages can name a file an installed wheel has (``data.sources.data_readme``).
"""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

CONFIGS = Path(__file__).resolve().parent / "configs"
#: where the configs land inside the wheel
TARGET = Path("canonical_network") / "configs"
#: config folders that are one machine's, not the project's
LOCAL = {"local"}
#: single files of the checkout a wheel carries: source (relative to the checkout) -> place in the wheel
SHIPPED_FILES = {Path("data") / "README.md": Path("canonical_network") / "data" / "README.md"}


def shipped_configs() -> list[Path]:
    """The config files a wheel carries, relative to ``configs/``."""
    files = (p.relative_to(CONFIGS) for p in CONFIGS.rglob("*.yaml"))
    return sorted(p for p in files if p.parts[0] not in LOCAL)


class BuildPyWithConfigs(build_py):
    def run(self):
        super().run()
        if self.editable_mode:  # the editable install's package is the checkout, which holds configs/
            return
        for relative in shipped_configs():
            target = Path(self.build_lib) / TARGET / relative
            self.mkpath(str(target.parent))
            self.copy_file(str(CONFIGS / relative), str(target))
        for source, target in SHIPPED_FILES.items():
            self.copy_file(str(CONFIGS.parent / source), str(Path(self.build_lib) / target))

    def get_outputs(self, include_bytecode=True):
        outputs = super().get_outputs(include_bytecode)
        if self.editable_mode:
            return outputs
        return (outputs + [str(Path(self.build_lib) / TARGET / relative) for relative in shipped_configs()]
                + [str(Path(self.build_lib) / target) for target in SHIPPED_FILES.values()])


setup(cmdclass={"build_py": BuildPyWithConfigs})
