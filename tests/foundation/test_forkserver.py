"""The suite's fork server runs each command as a process of its own: its
environment, directory, exit status and output, the project imported fresh."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests import forkserver

SHOW = (
    "import os, sys; print(os.getcwd(), os.environ.get('TM_FORK_PROBE'),"
    " sorted(m for m in ('matrix', 'runners', 'ninja') if m in sys.modules));"
    " print('said on stderr', file=sys.stderr); sys.exit(7)"
)


def test_a_command_gets_its_own_environment_directory_and_exit_status(tmp_path):
    env = {**os.environ, "TM_FORK_PROBE": "first"}
    done = forkserver.run(["-c", SHOW], cwd=tmp_path, env=env, timeout=60)
    assert done.returncode == 7
    # Nothing of the project (or of what reads Django's settings) was
    # imported before the command's own environment was known.
    assert done.stdout == f"{tmp_path} first []\n"
    assert done.stderr == "said on stderr\n"
    again = forkserver.run(
        ["-c", SHOW], cwd="/", env={**os.environ, "TM_FORK_PROBE": "second"}
    )
    assert again.stdout == "/ second []\n"


def test_a_command_past_its_timeout_is_killed_with_what_it_said(tmp_path):
    code = "import time; print('started', flush=True); time.sleep(60)"
    with pytest.raises(subprocess.TimeoutExpired) as raised:
        forkserver.run(["-c", code], cwd=tmp_path, env=dict(os.environ), timeout=1)
    assert raised.value.output == "started\n"
