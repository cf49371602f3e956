"""ETO's published data formats, in and out.

SFT: ``[{"id", "conversations": [{"from": "human"|"gpt", "value"}, ...]}]`` whose first two turns
are the instruction part (the task family's instructions, then "OK"). DPO:
``[{"id", "prompt", "chosen", "rejected"}]`` with the same turns. On import the instruction part
is replaced by this run's own prefix (system prompt and examples), so imported and explored
trajectories share one prompt.
"""

from __future__ import annotations

from flywheel.records import Message, Pair, Trajectory, opening_length

_ROLE_TO_ETO = {"user": "human", "assistant": "gpt"}
_ETO_TO_ROLE = {"human": "user", "gpt": "assistant"}


def _turns(messages: list[Message]) -> list[dict]:
    return [{"from": _ROLE_TO_ETO[m.role], "value": m.content} for m in messages]


def _messages(turns: list[dict]) -> list[Message]:
    out = []
    for turn in turns:
        role = _ETO_TO_ROLE.get(turn.get("from"))
        if role is None or not isinstance(turn.get("value"), str):
            raise ValueError(f"not an ETO turn: {turn!r}")
        out.append(Message(role=role, content=turn["value"], loss=role == "assistant"))
    return out


def _instruction_part(messages: list[Message]) -> list[dict]:
    """The instructions and their "OK": a system prompt becomes that pair; an opening already in
    that layout (AgentGym's, `opening_length` 2) is written as it is."""
    if opening_length(messages) == 2:
        return _turns(messages[:2])
    return [{"from": "human", "value": messages[0].content}, {"from": "gpt", "value": "OK"}]


def write_eto_sft(trajectories: list[Trajectory]) -> list[dict]:
    return [
        {
            "id": t.task_id,
            "reward": t.reward,
            "conversations": _instruction_part(t.messages) + _turns(t.messages[t.episode_start :]),
        }
        for t in trajectories
    ]


def read_eto_sft(items: list[dict], env: str, prefix: list[Message]) -> list[Trajectory]:
    trajectories = []
    for item in items:
        episode = _messages(item["conversations"][2:])
        if not episode or episode[0].role != "user":
            raise ValueError(
                f"ETO item {item.get('id')!r}: the task turn must follow the instructions"
            )
        trajectories.append(
            Trajectory(
                task_id=str(item["id"]),
                env=env,
                messages=prefix + episode,
                episode_start=len(prefix),
                reward=float(item.get("reward", 1.0)),
                success=True,
                n_steps=sum(m.role == "assistant" for m in episode),
                source="expert",
                finish_reason="done",
            )
        )
    return trajectories


def write_eto_dpo(pairs: list[Pair]) -> list[dict]:
    return [
        {
            "id": p.task_id,
            "prompt": _instruction_part(p.prompt[:-1]) + _turns(p.prompt[-1:]),
            "chosen": _turns(p.chosen),
            "rejected": _turns(p.rejected),
        }
        for p in pairs
    ]


def read_eto_dpo(items: list[dict], prefix: list[Message]) -> list[Pair]:
    return [
        Pair(
            task_id=str(item["id"]),
            prompt=prefix + _messages(item["prompt"][2:]),
            chosen=_messages(item["chosen"]),
            rejected=_messages(item["rejected"]),
            chosen_reward=1.0,
            rejected_reward=0.0,
        )
        for item in items
    ]
