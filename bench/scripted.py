"""The scripted policy the tests use (tests/scripted_policy.py), for the benches that need a
policy without a model (env_protocol, mcts_restore). tests/ is no package, so it is loaded from
its file; a test process that imported it already gets the same module."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def scripted_policy():
    if "scripted_policy" in sys.modules:
        return sys.modules["scripted_policy"]
    spec = importlib.util.spec_from_file_location(
        "scripted_policy", ROOT / "tests" / "scripted_policy.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["scripted_policy"] = module
    spec.loader.exec_module(module)
    return module


NoisyExpertBackend = scripted_policy().NoisyExpertBackend
