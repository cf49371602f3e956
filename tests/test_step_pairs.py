"""IPR's step pairs (`tasks.step_pairs`) on a real TextCraft task, with a scripted policy that
follows the expert's plan except where it is told to depart: which steps depart, how each side
is valued, and the pair by hand."""

from __future__ import annotations

import re

import pytest

from agents.rollout import Resume, expert_trajectory, instruction_part
from flywheel.chat import format_reply
from flywheel.inference import Generation, SamplingSettings
from flywheel.settings import EnvSettings, InferenceSettings
from tasks.step_pairs import (
    Departure,
    StepPairsInputs,
    StepPlayer,
    departures,
    find_step_pairs,
    step_pair,
)

WRONG = "inventory"
_GOAL = re.compile(r"Goal: craft (.+?)\.")
_ACTION = re.compile(r"^Action: (.*)$", re.MULTILINE)


class DepartingExpert:
    """Plays the expert's plan, except at agent turn `depart_at` (0-based) when it is still on
    the plan, where it checks its inventory instead. After any off-plan move it stalls
    (`recovers=False`: it checks its inventory for ever) or goes on with the plan."""

    def __init__(self, env, tokenizer, depart_at: int, recovers: bool):
        self.env, self.tokenizer = env, tokenizer
        self.depart_at, self.recovers = depart_at, recovers
        self.prompts = 0

    def generate(self, prompts: list[list[int]], sampling: SamplingSettings) -> list[Generation]:
        self.prompts += len(prompts)
        return [self._reply(p) for p in prompts]

    def _reply(self, prompt: list[int]) -> Generation:
        text = self.tokenizer.decode(prompt, skip_special_tokens=True)
        goal = list(_GOAL.finditer(text))[-1]
        plan = [a for _, a in self.env.expert_plan(goal[1].replace(" ", "_"))]
        taken = [a.strip() for a in _ACTION.findall(text[goal.end() :])]
        on_plan = taken == plan[: len(taken)]
        if on_plan and len(taken) == self.depart_at:
            action = WRONG
        elif on_plan or self.recovers:
            action = next(a for a in plan if a not in taken)
        else:
            action = WRONG
        reply = format_reply("Next.", action)
        ids = self.tokenizer(reply, add_special_tokens=False)["input_ids"]
        return Generation(reply, ids + [self.tokenizer.eos_token_id], "stop")


@pytest.fixture(scope="module")
def expert(textcraft):
    """An expert trajectory of at least three steps, all actions distinct."""
    for task_id in textcraft.task_ids("train"):
        plan = [a for _, a in textcraft.expert_plan(task_id)]
        if len(plan) >= 3 and len(set(plan)) == len(plan):
            return expert_trajectory(textcraft, task_id, instruction_part(textcraft))
    raise AssertionError("no TextCraft train task with a 3-step plan")


def stage_inputs(expert, rollouts: int = 0, takeover_samples: int = 0) -> StepPairsInputs:
    return StepPairsInputs(
        model_url="m", env=EnvSettings(), expert_url="e", task_ids=[expert.task_id],
        inference=InferenceSettings(), max_steps=expert.n_steps + 4, rollouts=rollouts,
        temperature=1.0, extra_turns=1, seed=0, takeover_samples=takeover_samples,
    )  # fmt: skip


def play(textcraft, chat, expert, rollouts: int, recovers: bool, depart_at: int = 1):
    backend = DepartingExpert(textcraft, chat.tokenizer, depart_at, recovers)
    inputs = stage_inputs(expert, rollouts)
    return find_step_pairs(StepPlayer(textcraft, backend, chat, inputs), [expert]), backend


def test_a_departure_that_stalls_is_paired_on_the_state_both_sides_share(textcraft, chat, expert):
    (pairs, counts), _ = play(textcraft, chat, expert, rollouts=0, recovers=False)
    assert dict(counts) == {
        "expert_steps": expert.n_steps, "departures": 1, "pairs": 1, "pairs_at_step_2": 1,
        "departures_unplayable": 0,
    }  # fmt: skip
    [pair] = pairs
    shared = expert.continuation[:2]  # the expert's first action and what answered it
    assert pair.step == 1 and pair.task_id == expert.task_id
    assert pair.prompt == expert.prompt + shared
    assert pair.chosen == expert.continuation[2:]  # the expert's path from the shared state
    assert "Action: " + WRONG in pair.rejected[0].content
    # cut to the chosen side's length plus one turn (two messages), ending on an agent turn
    assert len(pair.rejected) == len(pair.chosen) + 2 and pair.rejected[-1].role == "assistant"
    assert (pair.chosen_reward, pair.rejected_reward) == (1.0, 0.0)


def test_monte_carlo_values_pair_only_a_departure_that_does_worse(textcraft, chat, expert):
    (pairs, counts), backend = play(textcraft, chat, expert, rollouts=2, recovers=False)
    assert counts["departures"] == 1 and [p.step for p in pairs] == [1]
    # a greedy continuation per expert turn, then 2 + 2 sampled continuations of the departure
    assert backend.prompts > 0
    (pairs, counts), _ = play(textcraft, chat, expert, rollouts=2, recovers=True)
    assert counts["departures"] == 1 and pairs == []  # it recovers: both steps are worth 1


def test_no_departure_no_pair(textcraft, chat, expert):
    (pairs, counts), _ = play(textcraft, chat, expert, rollouts=0, recovers=False, depart_at=99)
    assert (counts["departures"], pairs) == (0, [])


def test_departures_compare_the_first_generated_action_only(textcraft, expert):
    # the expert's own path read as the policy's continuation from every step: no departure
    assert departures(expert, [[expert]] * expert.n_steps, textcraft) == []


class SometimesDeparting(DepartingExpert):
    """Of each call's prompts, those at odd positions depart (check the inventory) wherever they
    are, the others follow the plan while on it and stall off it: of two sampled takeovers from
    a turn, one follows the plan and one departs, where the greedy policy (depart_at=99) never
    departs."""

    def generate(self, prompts: list[list[int]], sampling: SamplingSettings) -> list[Generation]:
        self.prompts += len(prompts)
        replies = []
        for position, prompt in enumerate(prompts):
            text = self.tokenizer.decode(prompt, skip_special_tokens=True)
            taken = len(_ACTION.findall(text[list(_GOAL.finditer(text))[-1].end() :]))
            self.depart_at = taken if position % 2 else 99
            replies.append(self._reply(prompt))
        return replies


def test_sampled_takeovers_pair_moves_the_greedy_policy_never_makes(textcraft, chat, expert):
    inputs = stage_inputs(expert, takeover_samples=2)
    backend = SometimesDeparting(textcraft, chat.tokenizer, depart_at=99, recovers=False)
    pairs, counts = find_step_pairs(StepPlayer(textcraft, backend, chat, inputs), [expert])
    # one departure a turn (the second takeover), each stalls: a pair at every expert turn
    assert counts["departures"] == expert.n_steps == len(pairs)
    assert sorted(p.step for p in pairs) == list(range(expert.n_steps))
    assert all("Action: " + WRONG in p.rejected[0].content for p in pairs)
    # the same policy taking over greedily follows the plan: no pair
    greedy = inputs.model_copy(update={"takeover_samples": 0})
    backend = DepartingExpert(textcraft, chat.tokenizer, depart_at=99, recovers=False)
    assert find_step_pairs(StepPlayer(textcraft, backend, chat, greedy), [expert])[0] == []


def test_a_move_sampled_twice_at_a_step_departs_once(textcraft, chat, expert):
    inputs = stage_inputs(expert, takeover_samples=3)
    backend = DepartingExpert(textcraft, chat.tokenizer, depart_at=1, recovers=False)
    pairs, counts = find_step_pairs(StepPlayer(textcraft, backend, chat, inputs), [expert])
    assert counts["departures"] == 1 and [p.step for p in pairs] == [1]


def test_step_pair_keeps_no_pair_when_the_departure_is_worth_as_much(expert):
    departure = Departure(expert, 1, expert)
    assert departure.shared == len(Resume(expert, 1).kept) == 2
    assert step_pair(departure, expert_value=0.5, policy_value=0.5, extra_turns=1) is None
    assert step_pair(departure, expert_value=0.5, policy_value=0.4, extra_turns=1) is not None


@pytest.mark.parametrize("rollouts", [0, 2])
def test_on_the_qa_world_a_wrong_answer_after_the_solvers_calls_is_a_pair_at_the_answer(
    chat, rollouts
):
    """The tool format: actions read as the QA environment reads them; the policy follows the
    solver's calls, then answers wrongly (`tests.scripted_qa`). An answer ends the episode: each
    side's step is worth its own outcome, no continuation is sampled after it."""
    from envs import make_env
    from tests.scripted_qa import WRONG_ANSWER, PlannedQABackend

    env = make_env(EnvSettings(name="qa"))
    task = next(t for t in env.task_ids("train") if len(env.expert_plan(t)) >= 3)
    expert = expert_trajectory(env, task, instruction_part(env))
    inputs = StepPairsInputs(
        model_url="m", env=EnvSettings(name="qa"), expert_url="e", task_ids=[task],
        inference=InferenceSettings(), max_steps=6, rollouts=rollouts, temperature=1.0,
        extra_turns=1,
        seed=0,
    )  # fmt: skip
    backend = PlannedQABackend(env, chat, {task: "wrong-answer"}, mistake_seed=0)
    pairs, counts = find_step_pairs(StepPlayer(env, backend, chat, inputs), [expert])
    last = expert.n_steps - 1
    assert counts["departures"] == 1 and [p.step for p in pairs] == [last]
    [pair] = pairs
    assert pair.chosen == expert.continuation[-1:]  # the solver's answer, after its own calls
    assert pair.rejected[0].content == WRONG_ANSWER
    assert pair.prompt == expert.prompt + expert.continuation[:-1]
    assert (pair.chosen_reward, pair.rejected_reward) == (1.0, 0.0)


def test_sampled_takeovers_without_the_step_level_are_refused():
    from flows.eto import ETOConfig

    base = {"env": {"name": "textcraft"}, "model": {"base": "smollm2-135m"}}
    with pytest.raises(ValueError, match="set explore.level=step"):
        ETOConfig.model_validate({**base, "explore": {"step_samples": 4}})
    config = ETOConfig.model_validate({**base, "explore": {"step_samples": 4, "level": "step"}})
    assert config.explore.step_samples == 4
