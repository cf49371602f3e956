"""Run the agent in an environment: many episodes stepped together, one generate call per step.

Every live episode's prompt goes into the same `generate` call (vLLM batches them and reuses each
episode's cached prefix); an episode ends when the environment says done, at `max_steps`, or when
its context is full. (The one-request-at-a-time way ETO's and Agent-R's clients work is
bench/rollout_throughput.py's `run_sequential`.)
"""

from __future__ import annotations

import functools
import random
import time
from dataclasses import dataclass, field

from tqdm import tqdm

from agents.turns import Reply, Turns, turns_for
from envs.base import Environment, EnvironmentUnavailable, Episode, StepResult
from flywheel.chat import ChatTokenizer
from flywheel.inference import (
    Generation,
    InferenceBackend,
    OpenAIBackend,
    SamplingSettings,
    request_seed,
    sample_indices,
    shared_vllm,
)
from flywheel.records import EpisodeStats, Message, Trajectory
from flywheel.settings import EnvSettings
from flywheel.stage import StageResult
from flywheel.storage import ArtifactStore
from training.pareto import mixed_group_ids


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
    states = env.in_parallel(start, task_ids)
    for state, sample in zip(states, sample_indices(task_ids), strict=True):
        state.sample = sample
    live = [s for s in states if not s.finish_reason]
    failed = [
        s.error for s in states if s.error and not isinstance(s.error, EnvironmentUnavailable)
    ]
    if failed:  # an episode that cannot start is a bug or a broken setup, not the agent's doing
        for state in live:
            state.episode.close()
        raise failed[0]
    _play_closing(env, live, backend, chat, settings, progress, total=len(states))
    return [_to_trajectory(env, s, len(prefix), grouped=group) for s in states]


def _play_closing(env, live: list[_Live], backend, chat, settings, progress, total) -> None:
    try:
        _play(env, live, backend, chat, settings, progress, total=total)
    finally:  # also when generation fails: the environment's sessions are freed
        for state in live:
            if not state.finish_reason:
                state.episode.close()


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
    states = [_resume(env, turns, chat, resume) for resume in resumes]
    samples = sample_indices([resume.trajectory.task_id for resume in resumes])
    for state, sample in zip(states, samples, strict=True):
        state.sample = sample
    live = [s for s in states if not s.finish_reason]
    _play_closing(env, live, backend, chat, settings, progress, total=len(states))
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


def _play(env, live: list[_Live], backend, chat, settings, progress: bool, total: int) -> None:
    bar = tqdm(total=total, desc=f"{env.name} episodes", unit="ep", disable=not progress)
    bar.update(total - len(live))
    turns = turns_for(env)
    step = 0
    while live:
        step += 1
        prompts = [state.ids + chat.header_ids for state in live]
        generations = backend.generate(prompts, turn_sampling(settings.sampling, live))
        replies = [
            _reply(chat, turns, state, g) for state, g in zip(live, generations, strict=True)
        ]
        moves = [(s.episode, r.action) for s, r in zip(live, replies, strict=True) if r.action]
        results = iter(env.step_all(moves))  # all episodes' steps at once, in order
        for state, reply in zip(live, replies, strict=True):
            result = next(results) if reply.action else reply.error
            _observe(chat, turns, state, result, settings, reply.malformed)
            if state.finish_reason:
                state.episode.close()
                bar.update(1)
        live = [state for state in live if not state.finish_reason]
        bar.set_postfix(step=step, live=len(live))
    bar.close()


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
    solved = episode.solved() if episode else None
    if solved is None:
        solved = env.normalise(state.reward) >= 1.0
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


def within_expert_steps(env: Environment, task_ids: list[str], limit: int | None) -> list[str]:
    """The tasks the environment's expert solves in at most `limit` steps (all when None)."""
    if limit is None:
        return list(task_ids)
    return [t for t in task_ids if len(env.expert_plan(t) or ()) in range(1, limit + 1)]


def select_tasks(task_ids: list[str], limit: int | None, seed: int) -> list[str]:
    """A seeded sample of `limit` tasks (all when None), in the split's own order."""
    if limit is None or limit >= len(task_ids):
        return list(task_ids)
    chosen = set(random.Random(seed).sample(task_ids, limit))
    return [t for t in task_ids if t in chosen]


def task_list(env: Environment, split, env_settings, seed: int) -> list[str]:
    """The split's tasks a run uses: within `max_expert_steps`, then a seeded sample."""
    from flywheel.config_files import ConfigError

    limit = env_settings.train_tasks if split == "train" else env_settings.test_tasks
    eligible = within_expert_steps(env, env.task_ids(split), env_settings.max_expert_steps)
    if not env.task_ids(split):
        raise ConfigError(f"{env.name} has no {split} tasks: no run can use it")
    if not eligible:
        shortest = min(len(env.expert_plan(t) or ()) for t in env.task_ids(split))
        raise ConfigError(
            f"env.max_expert_steps={env_settings.max_expert_steps} leaves no {split} task of "
            f"{env.name}; its shortest expert plan has {shortest} steps"
        )
    if limit is not None and limit > len(eligible):  # never run fewer tasks than asked, silently
        within = (
            f" within env.max_expert_steps={env_settings.max_expert_steps}"
            if env_settings.max_expert_steps is not None
            else ""
        )
        raise ConfigError(
            f"env.{split}_tasks={limit}: the {split} split of {env.name} holds {len(eligible)} "
            f"tasks{within}; ask for at most {len(eligible)}, or leave env.{split}_tasks unset "
            "for all of them"
        )
    return select_tasks(eligible, limit, seed)


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


def open_backend(inference, model_dir: str, tokenizer, sampling: bool = True) -> InferenceBackend:
    """The backend `inference` (an `InferenceSettings`) names, for the model in `model_dir`;
    `sampling=False` for a stage that decodes greedily only (`shared_vllm`)."""
    if inference.backend == "openai":
        return OpenAIBackend(inference.base_url, model_dir, tokenizer=tokenizer)
    return shared_vllm(
        model_dir,
        inference.max_model_len,
        inference.kv_cache_gib,
        inference.block_size,
        inference.kv_cache_dtype,
        sampling,
    )


def rollout_to_store(
    store: ArtifactStore,
    stage: str,
    model_url: str,
    env_settings: EnvSettings,
    task_ids: list[str],
    prefix: list[Message],
    inference,
    max_steps: int,
    sampling: SamplingSettings,
    trajectories_url: str,
    samples_per_task: int = 1,
) -> StageResult:
    """Roll the model out on `task_ids`, store the trajectories, and return their statistics
    (the evaluate and explore stages publish them)."""
    from transformers import AutoTokenizer

    from envs import make_env

    model_dir = str(store.local_dir(model_url))
    chat = ChatTokenizer(AutoTokenizer.from_pretrained(model_dir))
    settings = RolloutSettings(max_steps, inference.max_model_len, sampling)
    env = make_env(env_settings)
    env.check()
    backend = open_backend(inference, model_dir, chat.tokenizer, sampling.temperature > 0)
    started = time.perf_counter()
    trajectories = run_batched(
        env, task_ids, backend, chat, prefix, settings, samples_per_task=samples_per_task
    )
    seconds = time.perf_counter() - started
    url = store.write_records(trajectories_url, trajectories)
    raise_if_lost(trajectories, url)
    endings = ending_counts(trajectories)
    if endings["retried"]:
        print(f"{stage}: {endings['retried']} episodes moved to another environment server")
    stats = EpisodeStats.of(trajectories)
    generated = sum(generated_tokens(t) for t in trajectories)
    groups = reward_groups(trajectories)
    group_metrics = (
        {
            "zero_variance_groups": zero_variance_share(groups),
            "mixed_outcome_groups": mixed_outcome_share(trajectories),
        }
        if groups
        else {}
    )
    return StageResult(
        files={"trajectories": url},
        counts={"episodes": stats.episodes, "successes": stats.successes, **endings},
        metrics={
            "success_rate": stats.success_rate,
            "average_reward": stats.average_reward,
            "average_steps": stats.average_steps,
            "generated_tokens_per_episode": generated / len(trajectories) if trajectories else 0,
            **episode_metric_means(trajectories),
            **group_metrics,
            "seconds": seconds,
            "generated_tokens_per_s": generated / seconds if seconds else 0.0,
            "deterministic_sampling": float(promises_determinism(backend)),
        },
        notes=determinism_notes(backend),
    )


def promises_determinism(backend: InferenceBackend) -> bool:
    """Whether the backend says a re-run samples the same episodes; one that does not say
    (a test's scripted backend, a new one) is taken to promise nothing."""
    return bool(getattr(backend, "deterministic_sampling", False))


def determinism_notes(backend: InferenceBackend) -> list[str]:
    """What a manifest says when the backend cannot promise the same episodes on a re-run."""
    if promises_determinism(backend):
        return []
    return [
        f"{type(backend).__name__} does not promise reproducible samples: every request carries "
        "its seed, but the engine's kernels or the server's batching can change its numbers, so a "
        "re-run may sample different episodes (docs/determinism.md)."
    ]


def generated_tokens(trajectory: Trajectory) -> int:
    """Tokens the model sampled in the episode (its replies' ids as generated)."""
    return sum(len(m.token_ids or ()) for m in trajectory.messages)


def episode_metric_means(trajectories: list[Trajectory]) -> dict[str, float]:
    """The mean of each per-episode metric the environment measured (`Trajectory.metrics`), as
    `episode_<name>`; an episode without a metric (one that could not start) counts as 0."""
    names = sorted({name for t in trajectories for name in t.metrics})
    n = len(trajectories)
    return {f"episode_{k}": sum(t.metrics.get(k, 0.0) for t in trajectories) / n for k in names}


def reward_groups(trajectories: list[Trajectory]) -> dict[str, list[float]]:
    """Rewards per group id (sampled groups only)."""
    groups: dict[str, list[float]] = {}
    for t in trajectories:
        if t.group_id is not None:
            groups.setdefault(t.group_id, []).append(t.reward)
    return groups


def zero_variance_share(groups: dict[str, list[float]]) -> float:
    """Share of groups whose samples all earned the same reward: a group-relative advantage is 0
    on every one of their tokens, so they teach the policy nothing."""
    flat = sum(1 for rewards in groups.values() if max(rewards) - min(rewards) < 1e-9)
    return flat / len(groups) if groups else 0.0


def mixed_outcome_share(trajectories: list[Trajectory]) -> float:
    """Share of the sampled groups holding both a success and a failure: the groups a signal on
    the outcome itself comes from (`rl.groups: mixed` trains on these alone)."""
    groups = {t.group_id for t in trajectories if t.group_id is not None}
    mixed = mixed_group_ids((t.group_id, t.success) for t in trajectories)
    return len(mixed) / len(groups) if groups else 0.0


class EpisodesLost(RuntimeError):
    """Some episodes could not be played to an end because their environment was unreachable."""


def raise_if_lost(trajectories: list[Trajectory], url: str) -> None:
    """A stage with lost episodes fails instead of publishing: a lost episode is not the agent's
    failure, and a re-run (servers back) plays the stage again instead of reusing it."""
    lost = [t for t in trajectories if t.finish_reason.startswith("lost")]
    if lost:
        raise EpisodesLost(
            f"{len(lost)} of {len(trajectories)} episodes were lost: no environment server could "
            f"play them (first: task {lost[0].task_id}: {lost[0].finish_reason}). All episodes, "
            f"with their reasons, are in {url}. Bring the servers back (env.servers) and re-run."
        )


def ending_counts(trajectories: list[Trajectory]) -> dict[str, int]:
    """How episodes ended (ended_done, ended_max_steps, ended_error, ...) and how many moved to
    another environment server on the way (`retried`: episodes, `recoveries`: moves)."""
    counts: dict[str, int] = {}
    for t in trajectories:
        key = "ended_" + t.finish_reason.split(":")[0]
        counts[key] = counts.get(key, 0) + 1
    counts["retried"] = sum(1 for t in trajectories if t.recoveries)
    counts["recoveries"] = sum(t.recoveries for t in trajectories)
    return counts
