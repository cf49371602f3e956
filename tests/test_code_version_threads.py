"""Stages keyed in several threads at once never parse modules at the same moment: CPython
3.11's ast.parse is not thread-safe (a chaos run's exploration shard failed with "SystemError:
AST constructor recursion depth mismatch")."""

from __future__ import annotations

import ast
import threading
import time
from pathlib import Path

import flywheel.code_version as code_version


def test_modules_are_parsed_one_at_a_time(monkeypatch):
    inside, most = 0, 0
    counting = threading.Lock()
    real_parse = ast.parse

    def slow_parse(source, *args, **kwargs):
        nonlocal inside, most
        with counting:
            inside += 1
            most = max(most, inside)
        time.sleep(0.05)  # long enough for the other threads to come in, were they let
        with counting:
            inside -= 1
        return real_parse(source, *args, **kwargs)

    monkeypatch.setattr(code_version.ast, "parse", slow_parse)
    threads = [
        threading.Thread(
            target=code_version._parse.__wrapped__,
            args=(f"m{i}", Path("/nonexistent"), False, f"x = {i}\n".encode()),
        )
        for i in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert most == 1
