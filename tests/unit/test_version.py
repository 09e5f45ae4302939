import tomllib
from pathlib import Path

import delayjobs

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def test_the_package_version_is_the_distributions():
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    assert delayjobs.__version__ == project["version"]
