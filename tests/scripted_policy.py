"""An inference backend that plays the environment's expert with seeded mistakes mixed in.

For benchmarks and tests of the tree search, where a model's cost and its randomness would hide
what is measured (environment steps, state restore against replay). It reads the task and the
agent's earlier actions back from the prompt, finds how far along the expert plan the agent got,
and replies with the plan's next step, or, with probability `mistake_rate`, a mistake. Like a
sampling model, the same prompt gives different replies under different seeds.
"""

from __future__ import annotations

import hashlib
import random
import re

from flywheel.chat import format_reply
from flywheel.inference import Generation, SamplingSettings

MISTAKES = (
    "inventory",
    "get 1 stick",
    "craft 1 stick using 2 oak planks",
    "get 2 cobblestone",
    "look around",
)
_GOAL = re.compile(r"Goal: craft (.+?)\.")
_ACTION = re.compile(r"^Action: (.*)$", re.MULTILINE)


class NoisyExpertBackend:
    def __init__(self, env, tokenizer, mistake_rate: float = 0.4):
        self.env, self.tokenizer, self.mistake_rate = env, tokenizer, mistake_rate
        self.calls: list[int] = []  # prompts per generate call

    def generate(self, prompts: list[list[int]], sampling: SamplingSettings) -> list[Generation]:
        self.calls.append(len(prompts))
        seeds = sampling.seeds_for(len(prompts))
        return [self._reply(p, seed or 0) for p, seed in zip(prompts, seeds, strict=True)]

    def _reply(self, prompt: list[int], seed: int) -> Generation:
        text = self.tokenizer.decode(prompt, skip_special_tokens=True)
        goal = list(_GOAL.finditer(text))[-1]  # the episode's own goal (examples come before)
        task_id = goal[1].replace(" ", "_")
        plan = [action for _, action in self.env.expert_plan(task_id)]
        done = 0
        for action in _ACTION.findall(text[goal.end() :]):
            if done < len(plan) and action.strip() == plan[done]:
                done += 1
        digest = hashlib.sha1(f"{seed}:{text[goal.end() :]}".encode()).digest()
        rng = random.Random(digest)
        if done < len(plan) and rng.random() >= self.mistake_rate:
            reply = format_reply(f"Step {done + 1} of my plan.", plan[done])
        else:
            reply = format_reply("Let me try this.", rng.choice(MISTAKES))
        ids = self.tokenizer(reply, add_special_tokens=False)["input_ids"]
        return Generation(reply, ids + [self.tokenizer.eos_token_id], "stop")

    def close(self) -> None:
        pass
