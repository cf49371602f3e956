"""The agent formats against hand-written replies: ReAct as today, tag calls, JSON tool calls."""

from __future__ import annotations

import pytest

from agents.formats import (
    Action,
    FinalAnswer,
    JSONFormat,
    ParseError,
    ReActFormat,
    TagFormat,
    ToolCall,
    make_format,
    tag_arguments,
)
from agents.rollout import expert_trajectory
from envs.base import Environment, Episode, StepResult
from flywheel.chat import FORMAT_HINT
from flywheel.records import Message

# ---- ReAct: today's behaviour, byte for byte -------------------------------------------------


def test_react_parses_thought_and_action_and_first_action_wins():
    parsed = ReActFormat().parse("Thought: need planks.\nAction: get 1 oak log\nAction: inventory")
    assert parsed == Action("get 1 oak log", "need planks.")


@pytest.mark.parametrize("text", ["", "hello", "Thought: hmm", "Action:   \n"])
def test_react_malformed_reply_is_the_format_hint(text):
    assert ReActFormat().parse(text) == ParseError(FORMAT_HINT)


def test_react_messages_are_the_rollouts_own():
    react = ReActFormat()
    turn = react.agent_message(Action("get 1 oak log", "I need a log."))
    assert turn.role == "assistant" and turn.loss
    assert turn.content == "Thought: I need a log.\nAction: get 1 oak log"
    seen = react.result_message("Got 1 oak log")
    assert (seen.role, seen.content, seen.loss) == ("user", "Observation: Got 1 oak log", False)
    hint = react.error_message(ParseError(FORMAT_HINT))
    assert hint.content == f"Observation: {FORMAT_HINT}"  # what the rollout appends today


class CountingEpisode(Episode):
    """Reach 3 by saying "add 1" three times; anything else is refused."""

    def __init__(self, task_id):
        self.task_id, self.instruction, self.total = task_id, "Goal: reach 3.", 0

    def step(self, action):
        if action != "add 1":
            return StepResult(f"Unknown action {action!r}.", 0.0, False)
        self.total += 1
        return StepResult(f"Total: {self.total}.", float(self.total == 3), self.total == 3)


class CountingEnv(Environment):
    name = "counting"

    def task_ids(self, split):
        return ["three"]

    def start(self, task_id):
        return CountingEpisode(task_id)

    def expert_plan(self, task_id):
        return [(f"Step {i}: one more.", "add 1") for i in range(1, 4)]


def test_react_rebuilds_an_expert_trajectory_byte_for_byte():
    """The rollout's expert trajectory, re-written through the format, is identical."""
    env, react = CountingEnv(), ReActFormat()
    prefix = [Message(role="system", content=env.system_prompt)]
    expert = expert_trajectory(env, "three", prefix)
    episode = env.start("three")
    rebuilt = prefix + [Message(role="user", content=episode.instruction)]
    plan = env.expert_plan("three")
    for i, (thought, action) in enumerate(plan):
        rebuilt.append(react.agent_message(Action(action, thought)))
        result = episode.step(action)
        if i < len(plan) - 1:
            rebuilt.append(react.result_message(result.observation))
    assert expert.success
    assert [m.model_dump() for m in rebuilt] == [m.model_dump() for m in expert.messages]
    assert rebuilt[3].content == "Observation: Total: 1."


def test_react_writes_no_tool_calls():
    with pytest.raises(TypeError):
        ReActFormat().render_turn(FinalAnswer("42"))


# ---- Tags ------------------------------------------------------------------------------------


def test_tags_parse_a_search_with_its_reasoning():
    parsed = TagFormat().parse("I should look it up.\n<search> capital of Elbonia </search>")
    assert parsed == ToolCall("search", {"query": "capital of Elbonia"}, "I should look it up.")


def test_tags_parse_python_keeping_its_indentation():
    reply = "<python>\n    for i in range(2):\n        print(i)\n</python>"
    parsed = TagFormat().parse(reply)
    assert parsed == ToolCall("python", {"code": "for i in range(2):\n    print(i)"})


def test_tags_parse_an_answer_and_ignore_think_tags_and_trailing_text():
    parsed = TagFormat().parse("<think>easy</think>\n<answer>Paris</answer> done")
    assert parsed == FinalAnswer("Paris", "<think>easy</think>")


@pytest.mark.parametrize(
    "reply, says",
    [
        ("<search>capital of Elbonia", "Unclosed <search>"),
        ("<search>a</search><python>print(1)</python>", "One call per turn"),
        ("<search>a</search>\n<search>b</search>", "makes 2"),
        ("<answer>4</answer><search>why</search>", "One call per turn"),
        ("<wiki>Elbonia</wiki>", "Unknown tool <wiki>"),
        ("I think the answer is 4.", "No call"),
        ("<think>hmm</think>", "No call"),
        ("<search>   </search>", "Empty <search>"),
        ("<search>a</python>", "Unclosed <search>"),
    ],
)
def test_tags_malformed_calls_are_parse_errors_the_agent_reads(reply, says):
    parsed = TagFormat().parse(reply)
    assert isinstance(parsed, ParseError) and says in parsed.message


def test_tags_render_and_parse_round_trip():
    tags = TagFormat()
    for move in [
        ToolCall("search", {"query": "q"}, "why"),
        FinalAnswer("42"),
        FinalAnswer("x", "t"),
    ]:
        assert tags.parse(tags.render_turn(move)) == move
    assert tags.render_turn(ToolCall("python", {"code": "print(1)"})) == "<python>print(1)</python>"


def test_tags_result_is_a_user_message_without_loss():
    message = TagFormat().result_message("1024")
    assert (message.role, message.content, message.loss) == (
        "user",
        "<result>\n1024\n</result>",
        False,
    )


def test_tags_know_only_the_tools_they_are_given():
    parsed = TagFormat({"calculator": "expression"}).parse("<search>x</search>")
    assert isinstance(parsed, ParseError) and "Unknown tool <search>" in parsed.message
    assert TagFormat({"calculator": "expression"}).parse("<calculator>1+1</calculator>") == (
        ToolCall("calculator", {"expression": "1+1"})
    )


# ---- JSON tool calls (Hermes / Qwen) ---------------------------------------------------------


def test_json_parses_a_call_as_the_qwen_template_writes_it():
    reply = 'Let me search.\n<tool_call>\n{"name": "search", "arguments": {"query": "Elbonia"}}\n</tool_call>'
    assert JSONFormat().parse(reply) == ToolCall("search", {"query": "Elbonia"}, "Let me search.")


def test_json_renders_what_the_qwen_template_renders():
    text = JSONFormat().render_turn(ToolCall("search", {"query": "Ünïcode", "k": 3}))
    assert (
        text
        == '<tool_call>\n{"name": "search", "arguments": {"query": "Ünïcode", "k": 3}}\n</tool_call>'
    )


def test_json_answer_tool_is_the_final_answer():
    reply = '<tool_call>{"name": "answer", "arguments": {"text": " 42 "}}</tool_call>'
    assert JSONFormat().parse(reply) == FinalAnswer("42")


def test_json_arguments_as_a_json_string_are_read():
    reply = '<tool_call>{"name": "python", "arguments": "{\\"code\\": \\"print(1)\\"}"}</tool_call>'
    assert JSONFormat().parse(reply) == ToolCall("python", {"code": "print(1)"})


@pytest.mark.parametrize(
    "reply, says",
    [
        ('<tool_call>{"name": "search", "arguments": {"query": "a"}}', "Unclosed <tool_call>"),
        ('<tool_call>{"name": "search", "arguments": {"query": </tool_call>', "Bad JSON"),
        ("<tool_call>{'name': 'search'}</tool_call>", "Bad JSON"),
        ('<tool_call>{"name": "wiki", "arguments": {}}</tool_call>', "Unknown tool 'wiki'"),
        ('<tool_call>["search"]</tool_call>', '"name" and "arguments"'),
        ('<tool_call>{"arguments": {}}</tool_call>', '"name" and "arguments"'),
        ('<tool_call>{"name": "search", "arguments": [1]}</tool_call>', "must be an object"),
        ('<tool_call>{"name": "search", "arguments": "{oops"}</tool_call>', 'Bad JSON in "arg'),
        ('<tool_call>{"name": "answer", "arguments": {}}</tool_call>', 'non-empty "text"'),
        ("The answer is 42.", "No call"),
        (
            '<tool_call>{"name": "search", "arguments": {"query": "a"}}</tool_call>\n'
            '<tool_call>{"name": "search", "arguments": {"query": "b"}}</tool_call>',
            "makes 2",
        ),
    ],
)
def test_json_malformed_calls_are_parse_errors_the_agent_reads(reply, says):
    parsed = JSONFormat().parse(reply)
    assert isinstance(parsed, ParseError) and says in parsed.message


def test_json_result_is_a_user_message_as_qwen_renders_a_tool_message():
    message = JSONFormat().result_message("[1] Elbonia: ...")
    assert message.content == "<tool_response>\n[1] Elbonia: ...\n</tool_response>"
    assert message.role == "user" and not message.loss


def test_parse_errors_come_back_as_plain_user_messages_without_loss():
    for agent_format in (TagFormat(), JSONFormat()):
        message = agent_format.error_message(ParseError("No call in this reply."))
        assert (message.role, message.content, message.loss) == (
            "user",
            "No call in this reply.",
            False,
        )


def test_make_format_by_name():
    assert isinstance(make_format("react"), ReActFormat)
    assert make_format("tags", {"search": "query"}).tools == {"search": "query"}
    assert make_format("json").tools == {"search", "python"}
    with pytest.raises(ValueError, match="unknown agent format"):
        make_format("xml")


# ---- formats and tools together --------------------------------------------------------------


def test_a_parsed_call_runs_on_its_tool_and_its_result_comes_back(tmp_path):
    from envs.sandbox import SandboxLimits
    from envs.tools import AnswerTool, PythonTool, SearchTool

    tools = {
        t.name: t
        for t in (
            SearchTool(["Elbonia's capital is Mudville."]),
            PythonTool(limits=SandboxLimits(root=str(tmp_path))),
            AnswerTool(),
        )
    }
    tags = TagFormat(tag_arguments(tools.values()))
    assert tags.tools == {"search": "query", "python": "code"}
    call = tags.parse("Compute it.\n<python>print(6 * 7)</python>")
    assert tags.result_message(tools[call.name].execute(call.arguments)).content == (
        "<result>\n42\n</result>"
    )
    call = JSONFormat(tools).parse(
        '<tool_call>{"name": "search", "arguments": {"query": "capital of Elbonia"}}</tool_call>'
    )
    assert tools[call.name].execute(call.arguments) == "[1] Elbonia's capital is Mudville."
    answer = JSONFormat(tools).parse(
        '<tool_call>{"name": "answer", "arguments": {"text": "Mudville"}}</tool_call>'
    )
    assert tools["answer"].execute({"text": answer.text}) == "Final answer recorded: Mudville"
