"""Scripted models for the QA flywheel's tests: a policy that plays the solver plan with planted
mistakes, and a judge whose replies a test chooses.

The policy finds the question in the prompt and how far along the solver plan the episode is
(the plan's turns, in order, in the episode's text), and replies with the plan's next turn.
Under the sampling seed `mistake_seed` (the flywheel's first rollout) it makes its task's planted
mistake instead: "repeat" the first search once more after it, or give a "wrong-answer". Like a
sampling model, other seeds (the later rounds) give other replies: the plan's.
"""

from __future__ import annotations

import re
import threading

from agents.turns import turns_for
from flywheel.inference import Generation

WRONG_ANSWER = "The results give the answer.\n<answer>Nobody</answer>"
NO_CALL = "I am not sure what to do next."


class PlannedQABackend:
    def __init__(self, env, chat, mistakes: dict[str, str], mistake_seed: int = 0):
        self.env, self.chat, self.mistakes, self.mistake_seed = env, chat, mistakes, mistake_seed
        self.calls: list[int] = []  # prompts per generate call
        turns = turns_for(env)
        self.plans = {
            task: [turns.written_turn(t, a).content for t, a in env.expert_plan(task)]
            for task in env.task_ids("train")
        }
        self.questions = {t: r.question for t, r in env.questions("train").items()}

    def generate(self, prompts, sampling):
        self.calls.append(len(prompts))
        return [self._reply(self.chat.tokenizer.decode(p), sampling.seed) for p in prompts]

    def _reply(self, prompt: str, seed: int) -> Generation:
        task = next(t for t in self.mistakes if f"Question: {self.questions[t]}" in prompt)
        episode = prompt.split(f"Question: {self.questions[task]}", 1)[1]
        plan = self.plans[task]
        done = 0
        while done < len(plan) and plan[done] in episode:
            done += 1
        text = plan[min(done, len(plan) - 1)]
        mistake = self.mistakes[task] if seed == self.mistake_seed else None
        if mistake == "repeat" and done == 1 and episode.count(plan[0]) == 1:
            text = plan[0]
        if mistake == "wrong-answer" and done == len(plan) - 1:
            text = WRONG_ANSWER
        if mistake == "malformed" and done == 1 and NO_CALL not in episode:
            text = NO_CALL  # no tool call in it: the format's error answers it
        ids = self.chat.tokenizer(text, add_special_tokens=False)["input_ids"]
        return Generation(text, ids + [self.chat.tokenizer.eos_token_id], "stop")

    def close(self):
        pass


_STEP_LINE = re.compile(r"^Step (\d+): (.*)$", re.M)


def judged_steps(prompt: str) -> list[str]:
    """The steps a judge prompt shows, in order."""
    return [text for _, text in _STEP_LINE.findall(prompt)]


def sensible_judge(prompt: str) -> str:
    """A judge that names a repeated step as redundant ("none" without one), and the last step
    (the answer) as the first flaw."""
    steps = judged_steps(prompt)
    if "Which step is redundant" in prompt:
        repeats = [i for i, s in enumerate(steps) if s in steps[:i]]
        if not repeats:
            return "Step: none"
        return (
            f"Step: {repeats[0] + 1}\nReason: it repeats step {steps.index(steps[repeats[0]]) + 1}."
        )
    return f"Step: {len(steps)}\nReason: the answer is not in the results."


class ScriptedJudgeBackend:
    """Replies `reply(prompt text)` to each prompt; `hang`: not before `release()` (a judge
    past any timeout, however slowly the machine runs the test), `fail` raises."""

    def __init__(self, chat, reply=sensible_judge, hang: bool = False, fail: bool = False):
        self.chat, self.reply, self.hang, self.fail = chat, reply, hang, fail
        self.released = threading.Event()
        self.calls: list[int] = []
        self.prompts: list[str] = []

    def generate(self, prompts, sampling):
        self.calls.append(len(prompts))
        if self.hang:
            self.released.wait(timeout=60)
        if self.fail:
            raise ConnectionError("judge server unreachable")
        texts = [self.chat.tokenizer.decode(p) for p in prompts]
        self.prompts += texts
        return [Generation(self.reply(t), [], "stop") for t in texts]

    def release(self):
        self.released.set()

    def close(self):
        self.release()
