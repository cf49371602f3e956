"""Run the agent in an environment: many episodes stepped together, one generate call per step.

Every live episode's prompt goes into the same `generate` call (vLLM batches them and reuses each
episode's cached prefix); an episode ends when the environment says done, at `max_steps`, or when
its context is full. (The one-request-at-a-time way ETO's and Agent-R's clients work is
bench/rollout_throughput.py's `run_sequential`.)
"""

from __future__ import annotations

import collections
import functools
from dataclasses import dataclass, field

from tqdm import tqdm

from agents.turns import Reply, Turns, turns_for
from envs.base import Environment, EnvironmentUnavailable, Episode, StepResult
from flywheel.chat import ChatTokenizer
from flywheel.inference import (
    Generation,
    InferenceBackend,
    SamplingSettings,
    request_seed,
    sample_indices,
)
from flywheel.records import Message, Trajectory


@dataclass(frozen=True)
class RolloutSettings:
    """Limits of one episode. `max_steps` should cover the expert's own step counts."""

    max_steps: int = 30
    max_model_len: int = 4096
    sampling: SamplingSettings = field(default_factory=SamplingSettings)


def instruction_part(env: Environment) -> list[Message]:
    """How a conversation opens: the environment's prompt as the system message, or, where the
    environment says how it is acknowledged (`Environment.prompt_acknowledgement`: AgentGym's
    clients' layout), as the first user turn and the assistant's answer, without loss."""
    if env.prompt_acknowledgement is None:
        return [Message(role="system", content=env.system_prompt)]
    return [
        Message(role="user", content=env.system_prompt),
        Message(role="assistant", content=env.prompt_acknowledgement, loss=False),
    ]


def agent_prefix(env: Environment, examples: list[Trajectory]) -> list[Message]:
    """The opening (`instruction_part`), then worked examples as earlier chat turns (each from its
    task's first turn; no loss on them)."""
    messages = instruction_part(env)
    for example in examples:
        turns = example.messages[example.episode_start :]
        messages += [m.model_copy(update={"loss": False}) for m in turns]
    return messages


def expert_trajectory(env: Environment, task_id: str, prefix: list[Message]) -> Trajectory | None:
    """Play the environment's expert plan; None when there is no expert or it fails."""
    plan = env.expert_plan(task_id)
    if plan is None:
        return None
    turns = turns_for(env)
    episode = env.start(task_id)
    messages = prefix + [Message(role="user", content=episode.instruction)]
    reward, done, steps = 0.0, False, 0
    for thought, action in plan:
        steps += 1
        messages.append(turns.written_turn(thought, action))
        result = episode.step(action)
        reward += result.reward
        done = result.done
        if done:
            break
        messages.append(turns.observation(result.observation))
    episode.close()
    if not done:
        return None
    return Trajectory(
        task_id=task_id,
        env=env.name,
        messages=messages,
        episode_start=len(prefix),
        reward=reward,
        success=env.normalise(reward) >= 1.0,
        n_steps=steps,
        source="expert",
        finish_reason="done",
        recoveries=getattr(episode, "recoveries", 0),  # moves to another environment server
    )


@dataclass
class _Live:
    task_id: str
    episode: Episode | None
    messages: list[Message]
    ids: list[int] = field(default_factory=list)
    sample: int = 0  # which of its task's episodes in the call (`sample_indices`): its seeds'
    reward: float = 0.0
    steps: int = 0
    finish_reason: str = ""
    error: Exception | None = None  # why the episode could not start


def _start(env: Environment, task_id: str, *, prefix: list[Message], prefix_ids, chat) -> _Live:
    try:
        episode = env.start(task_id)
    except Exception as error:  # see run_batched: lost ones are recorded, others raised
        return _Live(task_id, None, list(prefix), finish_reason=_error_reason(error), error=error)
    first = Message(role="user", content=episode.instruction)
    return _Live(task_id, episode, prefix + [first], prefix_ids + chat.message_ids(first)[0])


def run_batched(
    env: Environment,
    task_ids: list[str],
    backend: InferenceBackend,
    chat: ChatTokenizer,
    prefix: list[Message],
    settings: RolloutSettings,
    progress: bool = True,
    samples_per_task: int = 1,
) -> list[Trajectory]:
    """All episodes advance together: one `generate` call per step over the unfinished ones.

    The environment steps all live episodes at once (`Environment.step_all`: in threads, or one
    request per server for remote ones). Every task yields exactly one trajectory per sample,
    also when its episode could not start or its server was lost ("lost: ..."). With several
    samples per task, a task's trajectories (in a row) share the group id `task_id`, the group
    a GRPO-style advantage compares them within.
    """
    task_ids = [task_id for task_id in task_ids for _ in range(samples_per_task)]
    group = samples_per_task > 1
    prefix_ids, _ = chat.encode(prefix)
    start = functools.partial(_start, env, prefix=prefix, prefix_ids=prefix_ids, chat=chat)
    starts = [functools.partial(start, task_id) for task_id in task_ids]
    states = _play_all(
        env, starts, sample_indices(task_ids), backend, chat, settings, progress,
        refuse_broken_starts=True,
    )  # fmt: skip
    return [_to_trajectory(env, s, len(prefix), grouped=group) for s in states]


def _play_all(
    env, starts, samples, backend, chat, settings, progress, refuse_broken_starts=False
) -> list[_Live]:
    """Every episode played to its end, in `starts`' order (each a call that starts one), with
    at most `env.max_live_episodes` open at once: as episodes end, the next ones start. Each
    open episode holds an environment session (ScienceWorld's is a Java process), so the limit
    bounds memory; an episode's replies do not depend on which others run beside it
    (`turn_sampling`). With `refuse_broken_starts`, an episode that fails to start for any
    reason but a lost environment raises: a bug or a broken setup, not the agent's doing."""
    states: list[_Live | None] = [None] * len(starts)
    waiting = collections.deque(range(len(starts)))
    limit = env.max_live_episodes or len(starts)
    live: list[_Live] = []
    bar = tqdm(total=len(starts), desc=f"{env.name} episodes", unit="ep", disable=not progress)
    turns, step = turns_for(env), 0
    try:
        while live or waiting:
            admitted = [waiting.popleft() for _ in range(min(limit - len(live), len(waiting)))]
            started = env.in_parallel(lambda i: starts[i](), admitted)
            for i, state in zip(admitted, started, strict=True):
                state.sample, states[i] = samples[i], state
            live += [s for s in started if not s.finish_reason]
            bar.update(sum(1 for s in started if s.finish_reason))
            if refuse_broken_starts:
                _refuse_broken_starts(started)
            if live:
                step += 1
                live = _step(env, turns, live, backend, chat, settings, bar)
                bar.set_postfix(step=step, live=len(live))
    finally:  # also when generation fails: the environment's sessions are freed
        for state in live:
            if not state.finish_reason:
                state.episode.close()
        env.rollout_ended()
        bar.close()
    return states


def _refuse_broken_starts(started: list[_Live]) -> None:
    for state in started:
        if state.error and not isinstance(state.error, EnvironmentUnavailable):
            raise state.error


@dataclass(frozen=True)
class Resume:
    """Where a continued episode starts: `trajectory`'s first `steps` agent turns (and what
    answered them) played again, then `extra` messages (a hint), then the policy goes on."""

    trajectory: Trajectory
    steps: int
    extra: tuple[Message, ...] = ()

    @property
    def kept(self) -> list[Message]:
        """The episode's messages before its (`steps` + 1)-th agent turn."""
        episode = self.trajectory.continuation
        turns = [i for i, m in enumerate(episode) if m.role == "assistant"]
        end = turns[self.steps] if self.steps < len(turns) else len(episode)
        return episode[:end]


def continue_batched(
    env: Environment,
    resumes: list[Resume],
    backend: InferenceBackend,
    chat: ChatTokenizer,
    settings: RolloutSettings,
    progress: bool = False,
) -> list[Trajectory]:
    """Each resumed episode replays its kept agent turns (their token ids as generated), then
    the policy continues all of them together as `run_batched` does; one trajectory per resume,
    holding the extra messages where they were shown. The environment is deterministic: a
    replayed step whose observation differs from the recorded one ends that episode, recorded
    as "replay-mismatch: ..." (an error while replaying as "replay-error: ..."), not raised."""
    turns = turns_for(env)
    starts = [functools.partial(_resume, env, turns, chat, resume) for resume in resumes]
    samples = sample_indices([resume.trajectory.task_id for resume in resumes])
    states = _play_all(env, starts, samples, backend, chat, settings, progress)
    return [
        _to_trajectory(env, s, r.trajectory.episode_start, grouped=False)
        for s, r in zip(states, resumes, strict=True)
    ]


def _resume(env: Environment, turns: Turns, chat, resume: Resume) -> _Live:
    origin = resume.trajectory
    prefix = origin.messages[: origin.episode_start]
    state = _start(env, origin.task_id, prefix=prefix, prefix_ids=chat.encode(prefix)[0], chat=chat)
    if state.error is not None:
        return state
    try:
        problem = _replay(turns, chat, state, resume.kept)
    except Exception as error:  # the environment failed on a step it once took
        problem = f"replay-error: {type(error).__name__}: {error}"
    if problem is None and resume.extra:
        for message in resume.extra:
            state.messages.append(message)
            state.ids += chat.message_ids(message)[0]
    if problem is not None:
        state.finish_reason = problem
        state.episode.close()
    return state


def _replay(turns: Turns, chat, state: _Live, kept: list[Message]) -> str | None:
    """Step the kept agent turns again, appending the kept messages as recorded; what went
    wrong (a "replay-mismatch: ..."), or None."""
    for position, message in enumerate(kept):
        state.messages.append(message)
        state.ids += chat.message_ids(message)[0]
        if message.role != "assistant":
            continue
        state.steps += 1
        reply = turns.read(message.content)
        if not reply.action:
            observation = turns.observation(reply.error or "", reply.malformed)
        else:
            result = state.episode.step(reply.action)
            state.reward += result.reward
            if result.done:
                return f"replay-mismatch: step {state.steps} ended the episode"
            observation = turns.observation(result.observation, reply.malformed)
        recorded = kept[position + 1] if position + 1 < len(kept) else None
        if recorded is None or recorded.content != observation.content:
            return f"replay-mismatch: step {state.steps}'s observation differs from the record"
    return None


def _step(env, turns: Turns, live: list[_Live], backend, chat, settings, bar) -> list[_Live]:
    """One turn of every live episode: one `generate` call, all their actions stepped at once;
    the episodes still live after it."""
    prompts = [state.ids + chat.header_ids for state in live]
    generations = backend.generate(prompts, turn_sampling(settings.sampling, live))
    replies = [_reply(chat, turns, state, g) for state, g in zip(live, generations, strict=True)]
    moves = [(s.episode, r.action) for s, r in zip(live, replies, strict=True) if r.action]
    results = iter(env.step_all(moves))  # all episodes' steps at once, in order
    for state, reply in zip(live, replies, strict=True):
        result = next(results) if reply.action else reply.error
        _observe(chat, turns, state, result, settings, reply.malformed)
        if state.finish_reason:
            state.episode.close()
            bar.update(1)
    return [state for state in live if not state.finish_reason]


def turn_sampling(sampling: SamplingSettings, live: list[_Live]) -> SamplingSettings:
    """`sampling` with each live episode's seed for its next reply: the run's seed, its task,
    its sample index and its turn; never its place among the live episodes, which shifts as
    others end, so an episode's replies do not depend on which others run beside it."""
    seeds = [request_seed(sampling.seed, s.task_id, s.sample, s.steps) for s in live]
    return sampling.with_request_seeds(seeds)


def _reply(chat, turns: Turns, state: _Live, generation: Generation) -> Reply:
    """Add the model's reply to the episode (its ids as generated, and their log-probabilities
    when the backend returned them) and read it (its action, or what is wrong)."""
    reply = chat.generated_message(
        generation.text, generation.token_ids, logprobs=generation.logprobs
    )
    state.messages.append(reply)
    state.ids += chat.message_ids(reply)[0]
    state.steps += 1
    return turns.read(generation.text)


def _observe(
    chat, turns: Turns, state: _Live, result: StepResult | Exception | str, settings, malformed
) -> None:
    """What came back: the step's result, the step's error, or the format hint (no action);
    `malformed`: the step answered a reply that could not be parsed."""
    if isinstance(result, Exception):  # recorded; the other episodes go on
        state.finish_reason = _error_reason(result)
        return
    done = False
    observation = result
    if isinstance(result, StepResult):
        observation, done = result.observation, result.done
        state.reward += result.reward
        turn = state.messages[-1]  # the agent turn whose action this step took
        state.messages[-1] = turn.model_copy(update={"reward": result.reward})
    if done:
        state.finish_reason = "done"
    elif state.steps >= settings.max_steps:
        state.finish_reason = "max_steps"
    else:
        message = turns.observation(observation, malformed)
        state.messages.append(message)
        state.ids += chat.message_ids(message)[0]
        room = settings.max_model_len - len(chat.header_ids) - settings.sampling.max_tokens
        if len(state.ids) > room:
            state.finish_reason = "context"


# The finish reasons of episodes the environment failed ("error: ...") or lost ("lost: ..."):
# they say nothing about the policy (`_error_reason`).
ENVIRONMENT_FAILED = ("error", "lost")


def is_solved(env: Environment, episode: Episode | None, reward: float) -> bool:
    """The episode's own verdict where it gives one (`Episode.solved`), else a full reward."""
    verdict = episode.solved() if episode else None
    return env.normalise(reward) >= 1.0 if verdict is None else verdict


def _error_reason(error: Exception) -> str:
    """ "lost: ..." when the environment could not be reached (the episode says nothing about the
    policy), "error: ..." when it failed on the episode's own action."""
    kind = "lost" if isinstance(error, EnvironmentUnavailable) else "error"
    return f"{kind}: {type(error).__name__}: {error}"


def _to_trajectory(env: Environment, state: _Live, episode_start: int, grouped: bool) -> Trajectory:
    messages = state.messages
    if messages[-1].role == "user" and len(messages) > episode_start + 1:
        messages = messages[:-1]  # a trailing observation nobody answered
    episode = state.episode
    solved = is_solved(env, episode, state.reward)
    return Trajectory(
        task_id=state.task_id,
        env=env.name,
        messages=messages,
        episode_start=episode_start,
        reward=state.reward,
        success=state.finish_reason == "done" and solved,
        n_steps=state.steps,
        source="policy",
        finish_reason=state.finish_reason,
        recoveries=getattr(state.episode, "recoveries", 0),
        group_id=state.task_id if grouped else None,
        metrics=episode.metrics() if episode else {},
    )


def few_shot_examples(env: Environment, count: int, max_steps: int = 4) -> list[Trajectory]:
    """The first `count` train tasks whose expert needs at most `max_steps` steps, played out."""
    examples = []
    opening = instruction_part(env)
    for task_id in env.task_ids("train"):
        if len(examples) == count:
            break
        plan = env.expert_plan(task_id)
        if plan and len(plan) <= max_steps:
            trajectory = expert_trajectory(env, task_id, opening)
            if trajectory:
                examples.append(trajectory)
    return examples
