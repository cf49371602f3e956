# Not AgentGym's: its package __init__ imports agents and trainers (torch, transformers, openai).
# This one exposes what the TextCraft and SciWorld clients import, from AgentGym's own files.
from .env import BaseEnvClient, StepOutput
from .types import ActionFormat, ActionWithTought, ConversationMessage
from .utils import (
    BaseAdapter,
    extract_python_code_blocks,
    format_code_as_action_prompt,
    format_function_call_prompt,
    parse_python_code_comments,
)


class BaseTask:
    """A placeholder: AgentGym's BaseTask drives a model (transformers); the tests drive clients."""

    def __init__(self, client_args, n_clients=1, *args, **kwargs) -> None:
        raise NotImplementedError("not vendored; use the env clients directly")
