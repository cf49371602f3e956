"""Can a model's chat template carry the agent's turns? Checked before a run, not mid-way.

Training and rollouts render a conversation message by message (`flywheel.chat.ChatTokenizer`)
and put loss on the assistant turns' tokens only. A template that drops the assistant role,
raises on it (``raise_exception`` in Jinja), adds text that depends on the whole conversation,
or writes the assistant's content other than it was given breaks that silently: the masks
then cover the wrong tokens. `template_problem` renders a sample conversation in the
environment's own agent format (its real opening, a written tool call or action, the result,
a final turn) and checks the round trip:

1. the format reads each written turn back to the action it was written from;
2. the message-by-message token ids decode to the template's own rendering of the whole
   conversation;
3. the tokens under loss decode to exactly each assistant turn's content and the turn end.
"""

from __future__ import annotations

from agents.rollout import instruction_part
from agents.turns import turns_for
from envs import make_env
from envs.base import Environment
from envs.tools import call_action
from flywheel.chat import ChatTokenizer
from flywheel.config_files import ConfigError
from flywheel.model import ModelUnavailable, resolve_model
from flywheel.records import Message
from flywheel.settings import BUILTIN_MODELS, EnvSettings, ModelSettings

SAMPLE_TASK = "Task: craft 1 oak planks."
SAMPLE_RESULT = "Got 1 oak log."
_PROBE = "FLYWHEEL-TEMPLATE-PROBE"


def check_model(model: ModelSettings, env: EnvSettings) -> None:
    """Preflight: a Hub id resolves (online, or from the Hub cache offline) and the model's chat
    template renders the environment's agent turns (`template_problem`); else a
    `ConfigError` saying why. The built-ins' template (SmolLM2's) is known to work."""
    if model.base in BUILTIN_MODELS:
        return
    try:
        resolved = resolve_model(model.base, model.revision)
    except (ModelUnavailable, FileNotFoundError) as error:
        raise ConfigError(f"model.base: {error}") from None
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolved.path)
    environment = make_env(env)
    if problem := template_problem(tokenizer, environment):
        raise ConfigError(
            f"model.base={model.base!r}: its chat template cannot render the agent's turns "
            f"({environment.agent_format} format): {problem}. Give the tokenizer a chat "
            "template that renders system, user and assistant messages one by one (ChatML "
            "works), or pick another model"
        )


def sample_actions(env: Environment) -> list[tuple[str, str]]:
    """Two (thought, action) turns in the environment's format: a step, then a final one."""
    if env.agent_format == "react":
        return [("I need a log first.", "get 1 oak log"), ("Now craft.", "craft 1 oak planks")]
    tools = dict(env.tool_arguments)
    name, argument = next(iter(tools.items())) if tools else ("search", "query")
    step = call_action(name, {argument: "oak planks recipe"})
    return [("Look it up.", step), ("Done.", call_action("answer", {"text": "oak planks"}))]


def template_problem(tokenizer, env: Environment) -> str | None:
    """Why `tokenizer`'s chat template cannot render `env`'s agent turns, or None if it can."""
    if not getattr(tokenizer, "chat_template", None):
        return "the tokenizer has no chat template (tokenizer_config.json: chat_template)"
    try:
        return _round_trip_problem(tokenizer, env)
    except Exception as error:  # a template that raises (Jinja's raise_exception, a bad tag)
        return f"rendering failed: {type(error).__name__}: {error}"


def _round_trip_problem(tokenizer, env: Environment) -> str | None:
    probe = [{"role": "user", "content": "U"}, {"role": "assistant", "content": _PROBE}]
    if _PROBE not in tokenizer.apply_chat_template(probe, tokenize=False):
        return "it drops assistant turns (the 'assistant' role's content is not rendered)"
    chat = ChatTokenizer(tokenizer)  # raises when messages do not render independently
    turns = turns_for(env)
    messages = instruction_part(env) + [Message(role="user", content=SAMPLE_TASK)]
    for number, (thought, action) in enumerate(sample_actions(env)):
        written = turns.written_turn(thought, action)
        read = turns.read(written.content)
        if read.action != action:
            return f"the {env.agent_format} format reads {written.content!r} as {read.action!r}"
        messages.append(written)
        if number == 0:
            messages.append(turns.observation(SAMPLE_RESULT))
    ids, mask = chat.encode(messages)
    as_dicts = [{"role": m.role, "content": m.content} for m in messages]
    whole = tokenizer.apply_chat_template(as_dicts, tokenize=False)
    if tokenizer.decode(ids) != whole:
        return "rendered message by message, the conversation differs from the template's own"
    trained = _spans(ids, mask)
    wanted = [m.content + chat.turn_end for m in messages if m.role == "assistant" and m.loss]
    got = [tokenizer.decode(span) for span in trained]
    if got != wanted:
        return f"the loss covers {got!r}, not the assistant turns {wanted!r}"
    return None


def _spans(ids: list[int], mask: list[int]) -> list[list[int]]:
    """The runs of ids under loss (mask 1), in order."""
    spans: list[list[int]] = []
    for i, (token, flag) in enumerate(zip(ids, mask, strict=True)):
        if flag and (i == 0 or not mask[i - 1]):
            spans.append([])
        if flag:
            spans[-1].append(token)
    return spans
