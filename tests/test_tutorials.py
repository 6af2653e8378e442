"""Every tutorial runs (at its small size) and finishes without error."""

import pathlib
import subprocess
import sys

import pytest

TUTORIALS = sorted((pathlib.Path(__file__).parent.parent / "tutorials").glob("*.py"))
HEAVY = {"tune_cpu"}  # tunes with MetaSchedule: a minute and a half at its small size


@pytest.mark.parametrize("path", [pytest.param(p, id=p.stem, marks=[pytest.mark.heavy] if p.stem in HEAVY else [])
                                  for p in TUTORIALS])
def test_tutorial_runs(path):
    p = subprocess.run([sys.executable, str(path), "--small"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
