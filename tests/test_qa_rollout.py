"""The batched rollout over the QA environment in the tag format, with a scripted model: what an
RL stage reads from the trajectories (token ids, log-probabilities, masks, rewards, groups)."""

from __future__ import annotations

import pytest

from agents.rollout import RolloutSettings, agent_prefix, run_batched
from agents.turns import turns_for
from envs import make_env
from flywheel.inference import Generation
from flywheel.settings import EnvSettings

MALFORMED = "I think the answer is 7."  # no call


class ScriptedQABackend:
    """Replies to an episode's n-th turn with its task's n-th scripted reply (the task is found
    by its question in the prompt); every token's log-probability is -(its position + 1) / 10."""

    def __init__(self, chat, questions: dict[str, str], scripts: dict[str, list[str]]):
        self.chat, self.questions, self.scripts, self.calls = chat, questions, scripts, []

    def generate(self, prompts, sampling):
        self.calls.append(len(prompts))
        return [self._reply(self.chat.tokenizer.decode(prompt)) for prompt in prompts]

    def _reply(self, prompt: str) -> Generation:
        task = next(t for t, q in self.questions.items() if f"Question: {q}" in prompt)
        turn = prompt.split(f"Question: {self.questions[task]}")[1].count("<|im_start|>assistant")
        script = self.scripts[task]
        text = script[turn - 1] if turn <= len(script) else MALFORMED
        ids = self.chat.tokenizer(text, add_special_tokens=False)["input_ids"]
        ids += [self.chat.tokenizer.eos_token_id]
        return Generation(text, ids, "stop", [-(i + 1) / 10 for i in range(len(ids))])

    def close(self):
        pass


@pytest.fixture(scope="module")
def env():
    return make_env(EnvSettings(name="qa"))


def solver_replies(env, task_id: str) -> list[str]:
    turns = turns_for(env)
    return [turns.written_turn(t, a).content for t, a in env.expert_plan(task_id)]


def test_a_tag_format_rollout_records_what_rl_needs(env, chat):
    tasks = env.task_ids("test")
    solved = next(t for t in tasks if t.startswith("founder_age/"))  # search, search, python
    broken = next(t for t in tasks if t.startswith("founder_birth_town/"))
    questions = {t: env.questions("test")[t].question for t in (solved, broken)}
    right = env.questions("test")[broken].answer
    scripts = {
        solved: solver_replies(env, solved),
        broken: [MALFORMED, f"<answer>{right}</answer>"],  # right, after breaking the format
    }
    backend = ScriptedQABackend(chat, questions, scripts)
    settings = RolloutSettings(max_steps=6)
    trajectories = run_batched(
        env, [solved, broken], backend, chat, agent_prefix(env, []), settings, False, 2
    )
    assert [t.task_id for t in trajectories] == [solved, solved, broken, broken]
    assert [t.group_id for t in trajectories] == [solved, solved, broken, broken]
    win, _, loss, _ = trajectories
    assert win.success and win.reward == pytest.approx(1.1) and win.n_steps == 4
    # the right answer after a broken format: solved (exact match), and no reward at all
    assert loss.success and loss.reward == 0.0 and loss.finish_reason == "done"
    assert loss.metrics["format_valid"] == 0.0 and win.metrics["format_valid"] == 1.0
    assert backend.calls == [4, 4, 2, 2]  # all episodes per step; the broken ones end at 2

    for trajectory in trajectories:
        episode = trajectory.messages[trajectory.episode_start + 1 :]
        replies = [m for m in episode if m.role == "assistant"]
        observations = [m for m in episode if m.role != "assistant"]
        assert all(m.role == "user" and not m.loss for m in observations)
        for reply in replies:  # the ids as generated (end token stripped), their logprobs
            ids = chat.tokenizer(reply.content, add_special_tokens=False)["input_ids"]
            assert reply.loss and reply.token_ids == ids
            assert reply.logprobs == [-(i + 1) / 10 for i in range(len(ids))]
        assert sum(m.reward for m in replies) == pytest.approx(trajectory.reward)
        # no token of the prompt or of an observation carries loss
        ids, mask = chat.encode(trajectory.training_messages)
        generated = sum(len(r.token_ids) + len(chat.turn_end_ids) for r in replies)
        assert sum(mask) == generated

    tool_results = [m.content for m in win.continuation if m.role == "user"]
    assert all(r.startswith("<result>\n") and r.endswith("\n</result>") for r in tool_results)
    assert tool_results[-1] == f"<result>\n{env.questions('test')[solved].answer}\n</result>"
    hint = loss.continuation[1]  # the answer to the malformed reply: the format's error message
    assert hint.content.startswith("No call in this reply.") and not hint.loss
    assert [m.reward for m in loss.continuation if m.role == "assistant"] == [0.0, 0.0]


def test_one_sample_per_task_has_no_group_and_no_logprobs_unless_returned(env, chat):
    task = env.task_ids("test")[0]
    backend = ScriptedQABackend(
        chat, {task: env.questions("test")[task].question}, {task: solver_replies(env, task)}
    )
    backend_without_logprobs = _without_logprobs(backend)
    [trajectory] = run_batched(
        env, [task], backend_without_logprobs, chat, agent_prefix(env, []), RolloutSettings(6),
        progress=False,
    )  # fmt: skip
    assert trajectory.success and trajectory.group_id is None
    assert all(m.logprobs is None for m in trajectory.messages)


def _without_logprobs(backend):
    class Plain:
        def generate(self, prompts, sampling):
            return [
                Generation(g.text, g.token_ids, g.finish_reason)
                for g in backend.generate(prompts, sampling)
            ]

    return Plain()
