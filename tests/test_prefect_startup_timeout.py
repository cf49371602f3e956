"""A flow run on a loaded machine gives Prefect's temporary server 180 s to start, not Prefect's
20 s (a run failed before its first stage that way); a value the user set wins."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

READ = (
    "import flows.eto; from prefect.settings import get_current_settings; "
    "print(get_current_settings().server.ephemeral.startup_timeout_seconds)"
)


@pytest.mark.parametrize(("given", "expected"), [(None, "180"), ("42", "42")])
def test_the_temporary_server_gets_time_to_start(given, expected):
    env = {
        k: v
        for k, v in os.environ.items()
        if k != "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"
    }
    if given:
        env["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"] = given
    out = subprocess.run([sys.executable, "-c", READ], env=env, capture_output=True, text=True,
                         check=True)  # fmt: skip
    assert out.stdout.strip().splitlines()[-1] == expected
