"""The 2-thread speed comparison with PyTorch's SDPA (speed_vs_torch.py), printed and
never asserted. It needs torch, which qkv does not depend on: where torch is not
importable the test is skipped and says so."""

import os
import subprocess
import sys
from pathlib import Path

import pytest


def test_speed_against_torch_sdpa_is_printed(capsys):
    pytest.importorskip("torch", reason="torch is not importable: no SDPA to compare with")
    script = Path(__file__).with_name("speed_vs_torch.py")
    # a fresh interpreter, so both libraries start their pools on 2 threads
    env = dict(os.environ, RAYON_NUM_THREADS="2", OMP_NUM_THREADS="2", MKL_NUM_THREADS="2")
    run = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True,
                         timeout=900)
    assert run.returncode == 0, run.stderr
    with capsys.disabled():
        print("\n" + run.stdout)
