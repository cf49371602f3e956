"""Environments behind one interface (`envs.base`)."""

from envs.base import Environment


def make_env(name: str) -> Environment:
    """The environment called `name`, with its defaults."""
    if name == "textcraft":
        from envs.textcraft import TextCraftEnv

        return TextCraftEnv()
    raise ValueError(f"unknown environment {name!r}")
