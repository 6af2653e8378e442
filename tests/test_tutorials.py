"""Every tutorial runs (at its small size) and finishes without error."""

import pathlib
import subprocess
import sys

import pytest

TUTORIALS = sorted((pathlib.Path(__file__).parent.parent / "tutorials").glob("*.py"))


@pytest.mark.heavy  # each a new process end to end, 10 s to a minute and a half (tune_cpu tunes)
@pytest.mark.parametrize("path", TUTORIALS, ids=[p.stem for p in TUTORIALS])
def test_tutorial_runs(path):
    p = subprocess.run([sys.executable, str(path), "--small"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
