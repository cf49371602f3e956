"""A world small enough to work out by hand, and a backend that answers from a script: shared by
the tree-search tests and the resume tests."""

from __future__ import annotations

from envs.base import Environment, Episode, StepResult
from flywheel.inference import Generation


class Dial(Environment):
    """Tasks 't' and 'u' on a dial at 0: 'up' turns it one notch (reward 0.25), 'win' ends the
    episode from notch 1 on (reward 1), 'boom' raises. Rewards run to 2: score = reward / 2."""

    name = "dial"
    reward_range = (0.0, 2.0)

    def __init__(self):
        self.episodes = []

    def task_ids(self, split):
        return ["t", "u"]

    def start(self, task_id):
        self.episodes.append(DialEpisode(task_id))
        return self.episodes[-1]


class DialEpisode(Episode):
    def __init__(self, task_id):
        self.task_id, self.instruction = task_id, f"Goal: win {task_id}."
        self.notch, self.closed = 0, False

    def step(self, action):
        if action == "boom":
            raise ValueError("boom")
        if action == "win" and self.notch >= 1:
            return StepResult("You won.", 1.0, True)
        self.notch += action == "up"
        return StepResult(f"at {self.notch}", 0.25 if action == "up" else 0.0, False)

    def snapshot(self):
        return {"notch": self.notch}

    def restore(self, state):
        self.notch = state["notch"]

    def close(self):
        self.closed = True


class ScriptedCalls:
    """Call k answers its prompts with replies[k], in order; 'boom' stops without its end."""

    def __init__(self, tokenizer, replies):
        self.tokenizer, self.replies, self.calls = tokenizer, replies, []

    def generate(self, prompts, sampling):
        texts = self.replies[len(self.calls)]
        self.calls.append((prompts, sampling))
        assert len(texts) == len(prompts)
        out = []
        for text in texts:
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            end = [] if "boom" in text else [self.tokenizer.eos_token_id]
            out.append(Generation(text, ids + end, "stop"))
        return out
