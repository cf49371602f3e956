"""The RL trainer (`training.rl`) and its stage: rows and loss masks from sampled trajectories,
each estimator wired to its own function, the old and reference log-probabilities, and RL steps
on the tiny model that move the policy towards the rewarded answer."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from flywheel.config_files import ConfigError, validate_config  # noqa: E402
from flywheel.records import Message, Trajectory  # noqa: E402
from flywheel.settings import RLSettings  # noqa: E402
from training import rl  # noqa: E402
from training.advantages import (  # noqa: E402
    gae_advantages,
    grpo_advantages,
    kl_token_rewards,
    outcome_token_rewards,
    reinforce_pp_advantages,
    rloo_advantages,
    whiten,
)
from training.datasets import rl_rows  # noqa: E402
from training.job import TrainingJob  # noqa: E402

# A stalled forward (seen once on an overloaded machine) fails the test instead of holding CI.
pytestmark = pytest.mark.timeout(600)

ESTIMATORS = ("grpo", "dr-grpo", "rloo", "reinforce++", "ppo")
SYSTEM = Message(role="system", content="Answer the question.")
QUESTION = Message(role="user", content="Which colour is the sky?")


def sampled(chat, text: str, end: bool = True) -> Message:
    """A reply as the model sampled it; `end`: it sampled the end of its turn too."""
    ids = chat.tokenizer(text, add_special_tokens=False)["input_ids"]
    return Message(role="assistant", content=text, loss=True, token_ids=ids, end_generated=end)


def episode(messages: list[Message], reward: float = 0.0, group: str | None = "q") -> Trajectory:
    return Trajectory(task_id="q", env="qa", messages=[SYSTEM, QUESTION, *messages],
                      episode_start=1, reward=reward, group_id=group)  # fmt: skip


# ---- rows and masks -----------------------------------------------------------------------------


def test_only_sampled_tokens_carry_loss_and_the_sampler_logprobs_line_up(chat):
    search = sampled(chat, "<search>sky colour</search>")
    search.logprobs = [-0.1 * (i + 1) for i in range(len(search.token_ids))]
    result = Message(role="user", content="<result>The sky is blue.</result>")
    answer = sampled(chat, "<answer>blue</answer>", end=False)  # stopped on a stop string
    (row,), counts = rl_rows([episode([search, result, answer], reward=1.0)], chat, 512)

    prompt, _ = chat.encode([SYSTEM, QUESTION])
    header, end = chat.header_ids, chat.turn_end_ids
    tool_ids, _ = chat.message_ids(result)
    first = header + search.token_ids + end
    assert end == [chat.tokenizer.convert_tokens_to_ids("<|im_end|>"), 198]  # <|im_end|> "\n"
    assert row["input_ids"] == prompt + first + tool_ids + header + answer.token_ids + end
    ones = [1] * len(search.token_ids)
    expected_mask = (
        [0] * len(prompt)
        + [0] * len(header) + ones + [1, 0]  # the sampled <|im_end|>; the template's newline not
        + [0] * len(tool_ids)  # the tool's result
        + [0] * len(header) + [1] * len(answer.token_ids) + [0, 0]  # its end was not sampled
    )  # fmt: skip
    assert row["assistant_masks"] == expected_mask
    start = len(prompt) + len(header)
    tool = slice(len(prompt) + len(first), len(prompt) + len(first) + len(tool_ids))
    assert not any(row["assistant_masks"][tool])
    assert row["logprobs"][start : start + len(ones)] == search.logprobs
    assert [p for p in row["logprobs"] if p is not None] == search.logprobs  # nothing else
    assert (row["reward"], row["group_id"]) == (1.0, "q")
    assert counts.rows == 1


def test_worked_examples_are_context_and_unsampled_or_overlong_rows_are_left_out(chat):
    example = Message(role="assistant", content="<answer>green</answer>", loss=True)  # no ids
    with_example = Trajectory(
        task_id="q", env="qa", episode_start=3, reward=1.0, group_id="q",
        messages=[SYSTEM, Message(role="user", content="Example?"), example, QUESTION,
                  sampled(chat, "<answer>blue</answer>")],
    )  # fmt: skip
    expert_only = episode([example])  # text no policy sampled: nothing to learn from
    unlearned = sampled(chat, "<answer>red</answer>")
    unlearned.loss = False
    too_long = episode([sampled(chat, "blue " * 300)])
    rows, counts = rl_rows([with_example, expert_only, episode([unlearned]), too_long], chat, 256)
    (row,) = rows
    ids, _ = chat.encode(with_example.messages[:4])
    assert row["input_ids"][: len(ids)] == ids  # the chat as sampled, the example included
    assert not any(row["assistant_masks"][: len(ids)])
    assert (counts.rows, counts.rows_dropped_no_loss, counts.rows_dropped_too_long) == (1, 2, 1)


def test_old_logprobs_are_the_samplers_where_recorded_else_the_starting_models(chat):
    reply = sampled(chat, "<answer>blue</answer>")
    reply.logprobs = [-0.25] * len(reply.token_ids)
    rows = rl.as_tensors(rl_rows([episode([reply])], chat, 512)[0])
    rows.start_logp = torch.full(rows.mask.shape, -3.0)
    sampled_ids = rows.mask.nonzero()[:, 1].tolist()
    body, end = sampled_ids[:-1], sampled_ids[-1]
    assert len(body) == len(reply.token_ids)
    assert rows.old_logp[0, body].tolist() == [-0.25] * len(body)
    assert rows.old_logp[0, end] == -3.0  # the end token's is not recorded
    # Shifted by one: position t predicts token t+1, the end token <|im_end|>.
    full, _ = chat.encode(episode([reply]).messages)
    assert full[end + 1] == chat.turn_end_ids[0]


def test_gigpo_turns_and_anchor_states_come_from_the_episodes_messages(chat):
    """Each sampled turn is numbered on its tokens and keyed by every environment message before
    it: two episodes that searched alike and got the same result share their second state."""
    search = sampled(chat, "<search>sky colour</search>")
    blue = Message(role="user", content="<result>The sky is blue.</result>")
    grey = Message(role="user", content="<result>Grey, today.</result>")
    right = episode([search, blue, sampled(chat, "<answer>blue</answer>")], reward=1.0)
    same = episode([search, blue, sampled(chat, "<answer>red</answer>")], reward=0.0)
    other = episode([search, grey, sampled(chat, "<answer>grey</answer>")], reward=0.0)
    rows, _ = rl_rows([right, same, other], chat, 512)
    mask, turns = rows[0]["assistant_masks"], rows[0]["turn_of_token"]
    assert [t >= 0 for t in turns] == [bool(m) for m in mask]
    assert sorted(set(turns) - {-1}) == [0, 1]
    first, second = rows[0]["turn_anchors"]
    assert [r["turn_anchors"][0] for r in rows] == [first] * 3  # the question: one state
    assert rows[1]["turn_anchors"][1] == second != rows[2]["turn_anchors"][1]
    tensors = rl.as_tensors(rows)
    assert tensors.turn_anchors.tolist() == [[0, 1], [0, 1], [0, 2]]
    assert torch.equal(tensors.turn_of_token >= 0, tensors.mask)  # shifted with the mask
    settings = RLSettings(estimator="gigpo", gigpo_gamma=1.0)
    advantages, _ = rl.estimate_advantages(settings, tensors)
    answer = tensors.turn_of_token == 1
    # The answers after the blue result differ by the whole step advantage; the grey one's
    # state is met once, so it carries the episode advantage alone.
    episode_part = [2 / 3**0.5, -1 / 3**0.5, -1 / 3**0.5]
    assert advantages[0][answer[0]].unique().item() == pytest.approx(
        episode_part[0] + 2**-0.5, abs=1e-5
    )
    assert advantages[1][answer[1]].unique().item() == pytest.approx(
        episode_part[1] - 2**-0.5, abs=1e-5
    )
    assert advantages[2][answer[2]].unique().item() == pytest.approx(episode_part[2], abs=1e-5)


# ---- estimators ---------------------------------------------------------------------------------


def hand_rows() -> rl.Rows:
    """Two groups: rewards 1, 1, 0, 0 for one prompt, 1, 0 for another; 5 token positions."""
    generator = torch.Generator().manual_seed(0)
    mask = torch.tensor([[0, 1, 1, 1, 0]] * 4 + [[0, 0, 1, 1, 1]] * 2).bool()
    rows = rl.Rows(
        input_ids=[torch.arange(6)] * 6,
        mask=mask,
        recorded_logp=torch.full(mask.shape, float("nan")),
        rewards=torch.tensor([1.0, 1.0, 0.0, 0.0, 1.0, 0.0]),
        groups=torch.tensor([0, 0, 0, 0, 1, 1]),
        start_logp=-torch.rand(mask.shape, generator=generator),
        start_values=torch.rand(mask.shape, generator=generator),
    )
    rows.recorded_logp[:, 2] = -0.5
    return rows


SETTINGS = dict(kl_beta=0.3, gamma=0.9, gae_lambda=0.8)


@pytest.mark.parametrize(
    "estimator, first_group",
    [
        ("grpo", [0.866, 0.866, -0.866, -0.866]),  # (r - 0.5) / sqrt(1/3), std unbiased
        ("dr-grpo", [0.5, 0.5, -0.5, -0.5]),  # r - 0.5
        ("rloo", [2 / 3, 2 / 3, -2 / 3, -2 / 3]),  # r - mean of the other three
    ],
)
def test_group_estimators_give_the_hand_computed_advantages(estimator, first_group):
    rows = hand_rows()
    advantages, returns = rl.estimate_advantages(RLSettings(estimator=estimator), rows)
    assert returns is None
    assert advantages[:4, 1].tolist() == pytest.approx(first_group, abs=1e-3)
    assert (advantages[~rows.mask] == 0).all()
    assert (advantages[:4, 1:4] == advantages[:4, 1:2]).all()  # one value per sequence


def test_reinforce_pp_and_ppo_take_their_own_settings_and_the_reference():
    rows = hand_rows()
    settings = RLSettings(estimator="reinforce++", **SETTINGS)
    advantages, returns = rl.estimate_advantages(settings, rows)
    expected = reinforce_pp_advantages(rows.rewards, rows.old_logp, rows.start_logp, rows.mask,
                                       beta=0.3, gamma=0.9)  # fmt: skip
    assert returns is None and torch.allclose(advantages, expected)

    advantages, returns = rl.estimate_advantages(RLSettings(estimator="ppo", **SETTINGS), rows)
    token_rewards = outcome_token_rewards(rows.rewards, rows.mask)
    token_rewards += kl_token_rewards(rows.old_logp, rows.start_logp, rows.mask, 0.3)
    gae, want_returns = gae_advantages(token_rewards, rows.start_values, rows.mask, 0.9, 0.8)
    assert torch.allclose(advantages, whiten(gae, rows.mask))
    assert torch.allclose(returns, want_returns)


def test_every_estimator_gives_different_advantages():
    """So an estimator wired to another's function shows."""
    rows = hand_rows()
    results = {e: rl.estimate_advantages(RLSettings(estimator=e, **SETTINGS), rows)[0]
               for e in ESTIMATORS}  # fmt: skip
    for a in ESTIMATORS:
        for b in ESTIMATORS:
            assert a == b or not torch.allclose(results[a], results[b]), (a, b)
    assert torch.allclose(results["grpo"], grpo_advantages(rows.rewards, rows.groups, rows.mask))
    assert torch.allclose(results["rloo"], rloo_advantages(rows.rewards, rows.groups, rows.mask))


def test_aggregations_weigh_tokens_or_sequences():
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]]).bool()
    assert rl.sequence_weights(mask, "token-mean").tolist() == [0.75, 0.25]
    assert rl.sequence_weights(mask, "sequence-mean").tolist() == [0.5, 0.5]


def test_optimizer_batches_cover_each_row_at_most_once_and_split_over_processes():
    batches = rl.optimizer_batches(11, batch_size=4, processes=2, seed=3)
    assert [len(b) for b in batches] == [4, 4, 2]  # the 11th row waits for another shuffle
    assert len({i for b in batches for i in b}) == 10
    assert rl.optimizer_batches(11, 4, 2, seed=3) == batches  # the same on every process
    assert rl.optimizer_batches(11, 4, 2, seed=4) != batches


# ---- settings -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "section, message",
    [
        ({"estimator": "ppo2"}, "rl.estimator: Input should be 'grpo', 'dr-grpo', 'rloo'"),
        ({"clip_low": 1.0}, "rl.clip_low: Value error, clip_low=1.0 clips the ratio at 0"),
        ({"aggregation": "sum"}, "rl.aggregation: Input should be 'token-mean' or"),
        ({"batch_size": 3, "num_processes": 2}, "must be a multiple of num_processes=2"),
    ],
)
def test_bad_rl_settings_say_what_to_fix(section, message):
    from pydantic import BaseModel

    class WithRL(BaseModel):
        rl: RLSettings

    with pytest.raises(ConfigError, match="invalid config") as error:
        validate_config(WithRL, {"rl": section})
    assert message in str(error.value)


# ---- training on the tiny model -----------------------------------------------------------------


def colour_group(chat) -> list[Trajectory]:
    """One question, four samples: "blue" rewarded twice, "red" not. The replies share no
    token but the end of the turn: a shared prefix would be pushed both ways."""
    return [episode([sampled(chat, c)], reward=float(c == "blue"))
            for c in ("blue", "red", "blue", "red")]  # fmt: skip


def answer_logprobs(model_dir, chat) -> list[float]:
    """The model's log-probability of the blue and of the red reply (its sampled tokens)."""
    from transformers import AutoModelForCausalLM

    policy = rl.Policy(AutoModelForCausalLM.from_pretrained(model_dir), None)
    rows = rl.as_tensors(rl_rows(colour_group(chat)[:2], chat, 512)[0])
    with torch.no_grad():
        return [float(policy(ids[None])[0][0][rows.mask[i]].sum())
                for i, ids in enumerate(rows.input_ids)]  # fmt: skip


def write_trajectories(path, trajectories) -> str:
    path.write_text("".join(t.model_dump_json() + "\n" for t in trajectories))
    return str(path)


def rl_job(model_dir, data_file: str, output_dir, settings: RLSettings) -> TrainingJob:
    """An RL job with `settings` (sequences up to 512 tokens), seed 0."""
    settings = settings.model_copy(update={"max_length": 512})
    return TrainingJob[RLSettings](
        model_dir=str(model_dir), data_file=data_file, output_dir=str(output_dir),
        settings=settings, seed=0,
    )  # fmt: skip


def colour_job(tmp_path, model_dir, chat, settings: RLSettings) -> TrainingJob:
    """A training job on `colour_group`, written under `tmp_path`."""
    data = write_trajectories(tmp_path / "group.jsonl", colour_group(chat))
    return rl_job(model_dir, data, tmp_path / "model", settings)


@pytest.fixture(scope="module")
def starting_logprobs(tiny_model_dir, chat):
    return answer_logprobs(tiny_model_dir, chat)


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_an_rl_step_moves_the_policy_towards_the_rewarded_answer(
    estimator, tmp_path, tiny_model_dir, chat, starting_logprobs
):
    settings = RLSettings(estimator=estimator, learning_rate=1e-3, epochs=2, batch_size=4)
    job = colour_job(tmp_path, tiny_model_dir, chat, settings)
    metrics = rl.train(job)

    blue_before, red_before = starting_logprobs
    blue_after, red_after = answer_logprobs(job.output_dir, chat)
    assert blue_after > blue_before + 0.1
    assert red_after < red_before - 0.1
    assert metrics["optimizer_steps"] == 2 and metrics["processes"] == 1
    assert metrics["groups"] == 1 and metrics["groups_zero_reward_variance"] == 0
    assert metrics["loss_tokens_trained"] == 2 * metrics["loss_tokens_per_epoch"] > 0
    assert metrics["kl"] > 0 and 0 <= metrics["clip_fraction"] <= 1
    assert metrics["mean_advantage"] == pytest.approx(0, abs=1e-5)
    assert (tmp_path / "model" / rl.VALUE_HEAD_FILE).exists() == (estimator == "ppo")
    # vLLM loads every *.safetensors at the top of the folder as the model's weights
    assert [f.name for f in (tmp_path / "model").glob("*.safetensors")] == ["model.safetensors"]


@pytest.mark.parametrize("estimator", ["grpo", "rloo"])
def test_without_a_kl_term_a_group_baseline_learns_without_the_starting_pass(
    estimator, tmp_path, tiny_model_dir, chat, starting_logprobs, monkeypatch
):
    monkeypatch.setattr(rl, "starting_pass", lambda *a: pytest.fail("the pass is not needed"))
    settings = RLSettings(
        estimator=estimator, learning_rate=1e-3, epochs=2, batch_size=4, kl_beta=0.0
    )
    job = colour_job(tmp_path, tiny_model_dir, chat, settings)
    metrics = rl.train(job)
    blue_before, red_before = starting_logprobs
    blue_after, red_after = answer_logprobs(job.output_dir, chat)
    assert blue_after > blue_before + 0.1 and red_after < red_before - 0.1
    assert metrics["kl"] == 0 and metrics["optimizer_steps"] == 2


def test_a_token_without_a_recorded_logprob_keeps_its_first_visit_value():
    rows = rl.Rows(
        input_ids=[torch.tensor([1, 2, 3, 4])],
        mask=torch.tensor([[False, True, True]]),
        recorded_logp=torch.tensor([[float("nan"), -0.5, float("nan")]]),
        rewards=torch.tensor([1.0]),
        groups=torch.tensor([0]),
    )
    first = rl.first_visit_logp(rows, 0, torch.tensor([[-1.0, -2.0, -3.0]]))
    assert first.tolist() == [[-1.0, -0.5, -3.0]]  # the sampler's where recorded
    later = rl.first_visit_logp(rows, 0, torch.tensor([[-9.0, -9.0, -9.0]]))
    assert later.tolist() == [[-1.0, -0.5, -3.0]]  # the first visit's, not the new policy's
    assert rl.needs_starting_pass(RLSettings(estimator="grpo", kl_beta=0.0)) is False
    assert rl.needs_starting_pass(RLSettings(estimator="grpo", kl_beta=0.01)) is True
    assert rl.needs_starting_pass(RLSettings(estimator="reinforce++", kl_beta=0.0)) is True
    assert rl.needs_starting_pass(RLSettings(estimator="ppo", kl_beta=0.0)) is True


def test_forward_chunks_keep_count_times_longest_within_the_budget():
    lengths = [3, 5, 2, 4]
    assert rl.forward_chunks([0, 1, 2, 3], lengths, 10) == [[0, 1], [2, 3]]  # 2x5, then 2x4
    assert rl.forward_chunks([0, 1, 2, 3], lengths, 9) == [[0], [1], [2, 3]]
    assert rl.forward_chunks([3, 1], lengths, 0) == [[3], [1]]  # a CPU: one sequence a forward
    assert rl.forward_chunks([1], lengths, 1) == [[1]]  # a row longer than the budget runs alone
    settings = RLSettings(max_length=512)
    assert (
        rl.forward_tokens(settings, "cuda") == 4 * 512 and rl.forward_tokens(settings, "cpu") == 0
    )


def test_a_padded_forward_gives_each_row_what_its_own_forward_gives(tiny_model_dir, chat):
    """The GPU's batched rows against the CPU's one sequence a forward: the same starting
    log-probabilities and values, losses and gradients (PPO: every term of the loss)."""
    from transformers import AutoModelForCausalLM

    replies = ["blue", "red, as the evening sky turns at sunset", "blue again", "no idea, sorry"]
    trajectories = [episode([sampled(chat, r)], reward=float(i % 2 == 0))
                    for i, r in enumerate(replies)]  # fmt: skip
    rows = rl.as_tensors(rl_rows(trajectories, chat, 512)[0])
    assert len({len(t) for t in rows.input_ids}) == 4  # every row padded differently
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    policy = rl.Policy(model, rl.value_head_for(model, str(tiny_model_dir)))
    torch.nn.init.normal_(policy.value_head.weight, std=0.1)  # values that differ by position
    settings = RLSettings(estimator="ppo", kl_beta=0.01)

    rl.starting_pass(policy, rows, "cpu", budget=4 * 512)
    batched = rows.start_logp.clone(), rows.start_values.clone()
    rl.starting_pass(policy, rows, "cpu")
    assert torch.allclose(batched[0], rows.start_logp, atol=1e-5)
    assert torch.allclose(batched[1], rows.start_values, atol=1e-5)

    advantages, returns = rl.estimate_advantages(settings, rows)

    def losses_and_gradients(chunks):
        policy.zero_grad()
        sums = rl.Sums()
        losses = torch.cat([rl.chunk_losses(policy, settings, rows, c, advantages, returns, sums)
                            for c in chunks])  # fmt: skip
        (losses * torch.tensor([0.1, 0.2, 0.3, 0.4])).sum().backward()
        grads = [p.grad.clone() for p in policy.parameters() if p.grad is not None]
        return losses.detach(), grads, (sums.tokens, sums.clipped)

    together = losses_and_gradients([[0, 1, 2, 3]])
    alone = losses_and_gradients([[0], [1], [2], [3]])
    assert torch.allclose(together[0], alone[0], atol=1e-5) and bool(alone[0].abs().sum() > 0)
    assert len(together[1]) == len(alone[1]) > 0
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(together[1], alone[1], strict=True))
    assert together[2] == alone[2]


def test_a_group_with_equal_rewards_teaches_grpo_nothing(tmp_path, tiny_model_dir, chat):
    group = colour_group(chat)
    for trajectory in group:
        trajectory.reward = 1.0
    settings = RLSettings(estimator="grpo", learning_rate=1e-3, kl_beta=0.0, batch_size=4)
    data = write_trajectories(tmp_path / "g.jsonl", group)
    job = rl_job(tiny_model_dir, data, tmp_path / "model", settings)
    metrics = rl.train(job)
    assert metrics["groups_zero_reward_variance"] == 1
    assert metrics["mean_advantage"] == 0 and metrics["loss"] == 0
    # no KL term: the rows are skipped, not trained; the model is saved as it was
    assert metrics["rows_skipped_zero_advantage"] == 4 and metrics["optimizer_steps"] == 0
    assert answer_logprobs(job.output_dir, chat) == pytest.approx(
        answer_logprobs(tiny_model_dir, chat)
    )


def test_rows_without_advantage_are_skipped_only_when_no_kl_term_needs_them(
    tmp_path, tiny_model_dir, chat
):
    flat = [episode([sampled(chat, "green")], reward=0.5, group="flat") for _ in range(2)]
    data = write_trajectories(tmp_path / "g.jsonl", colour_group(chat) + flat)
    trained = {}
    for kl_beta in (0.0, 0.1):
        settings = RLSettings(estimator="grpo", learning_rate=1e-3, kl_beta=kl_beta, batch_size=8)
        job = rl_job(tiny_model_dir, data, tmp_path / f"m{kl_beta}", settings)
        trained[kl_beta] = rl.train(job)
    without_kl, with_kl = trained[0.0], trained[0.1]
    assert (
        without_kl["rows_skipped_zero_advantage"] == 2
        and with_kl["rows_skipped_zero_advantage"] == 0
    )
    assert without_kl["groups"] == with_kl["groups"] == 2  # counted over all rows
    assert without_kl["groups_zero_reward_variance"] == 1
    assert without_kl["reward_mean"] == pytest.approx((2 + 1.0) / 6)
    per_row = with_kl["loss_tokens_per_epoch"] / 6  # every reply is one word and its end
    assert without_kl["loss_tokens_trained"] == with_kl["loss_tokens_trained"] - 2 * per_row


def outcome(reward: float, success: bool, group: str | None) -> Trajectory:
    return episode([], reward=reward, group=group).model_copy(update={"success": success})


def test_mixed_outcome_groups_keep_only_groups_with_a_success_and_a_failure():
    sampled = [
        outcome(1.1, True, "a"), outcome(0.1, False, "a"),  # mixed: kept
        outcome(0.1, False, "b"), outcome(0.0, False, "b"),  # format term only: dropped
        outcome(1.1, True, "c"), outcome(1.0, True, "c"),  # all solved: dropped
        outcome(1.1, True, None),  # no group: a group of one, dropped
        outcome(0.9, False, "d"), outcome(0.1, False, "d"),  # a high reward is no success
        outcome(0.0, False, "a"),  # a late member of group a: kept, in its place
    ]  # fmt: skip
    kept = rl.mixed_outcome_groups(sampled)
    assert [(t.group_id, t.reward) for t in kept] == [("a", 1.1), ("a", 0.1), ("a", 0.0)]
    assert rl.mixed_outcome_groups(sampled[2:9]) == []


def test_mixed_groups_setting_trains_on_those_groups_alone(tmp_path, tiny_model_dir, chat):
    # colour_group: one success in a group with failures; "format": rewards that differ by the
    # format term only, no success.
    formatted = [
        episode([sampled(chat, c)], reward=r, group="format")
        for c, r in (("green", 0.1), ("yellow", 0.0))
    ]
    solved = [t.model_copy(update={"success": t.reward == 1.0}) for t in colour_group(chat)]
    data = write_trajectories(tmp_path / "g.jsonl", solved + formatted)
    trained = {}
    for groups in ("all", "mixed"):
        settings = RLSettings(estimator="grpo", learning_rate=1e-3, kl_beta=0.0, batch_size=8,
                              groups=groups)  # fmt: skip
        job = rl_job(tiny_model_dir, data, tmp_path / groups, settings)
        trained[groups] = rl.train(job)
    every, mixed = trained["all"], trained["mixed"]
    assert every["trajectories_dropped_uniform_outcome"] == 0 and every["groups"] == 2
    assert mixed["trajectories_dropped_uniform_outcome"] == 2 and mixed["groups"] == 1
    per_row = every["loss_tokens_trained"] / 6  # every reply is one word and its end
    assert mixed["loss_tokens_trained"] == every["loss_tokens_trained"] - 2 * per_row

    only_format = write_trajectories(tmp_path / "f.jsonl", formatted)
    job = rl_job(tiny_model_dir, only_format, tmp_path / "none", RLSettings(groups="mixed"))
    with pytest.raises(ValueError, match="kept 0 of 2.*rl.groups=all"):
        rl.train(job)


def test_main_reads_the_job_file_and_refuses_data_without_sampled_tokens(
    tmp_path, monkeypatch, tiny_model_dir
):
    expert = episode([Message(role="assistant", content="<answer>blue</answer>", loss=True)])
    data = write_trajectories(tmp_path / "t.jsonl", [expert])
    job = TrainingJob[RLSettings](
        model_dir=str(tiny_model_dir), data_file=data, output_dir=str(tmp_path),
        settings=RLSettings(), seed=0,
    )  # fmt: skip
    seen = []
    monkeypatch.setattr(rl, "train", lambda j: seen.append(j) or {"loss": 0.5})
    target = tmp_path / "metrics.json"
    monkeypatch.setenv("FLYWHEEL_METRICS_FILE", str(target))
    rl.main(["--config", str(job.save(tmp_path / "job.json"))])
    assert seen == [job] and json.loads(target.read_text()) == {"loss": 0.5}

    monkeypatch.undo()
    with pytest.raises(ValueError, match="no trajectory has sampled tokens to learn from"):
        rl.train(job)


def test_the_stage_trains_in_its_own_process(tmp_path, tiny_model_dir, chat):
    from safetensors.torch import load_file

    from flywheel.stage import StageOutput
    from flywheel.storage import ArtifactStore
    from tasks.rl import RLInputs, rl_stage

    store = ArtifactStore(str(tmp_path / "store"))
    data = store.write_records(store.url("rollouts.jsonl"), colour_group(chat))
    settings = RLSettings(estimator="rloo", learning_rate=1e-3, batch_size=2, max_length=512)
    inputs = RLInputs(model_url=f"file://{tiny_model_dir}", data_url=data, settings=settings,
                      seed=0)  # fmt: skip
    result = rl_stage.fn(inputs, StageOutput(store_url=store.root, url=store.url("rl")))

    assert result.metrics["optimizer_steps"] == 2 and result.metrics["rows"] == 4
    model = store.local_dir(result.files["model"])
    start = load_file(tiny_model_dir / "model.safetensors")
    trained = load_file(model / "model.safetensors")
    assert max((trained[k] - start[k]).abs().max().item() for k in start) > 1e-4
    assert "optimizer_steps" in store.read_text(result.files["log"])
