"""The efficacy bench's arithmetic: tokens to reach a stage, the orderings it checks, the
bootstrap interval's ends, the paired rows pooled over seeds x tasks, and the split it reads
(validation held out of training, disjoint from test)."""

import json

import pytest

from bench import efficacy


def test_tokens_to_reach_a_stage_add_sft_and_every_round_up_to_its_own():
    tokens = {"sft": 100, "round-1/dpo": 10, "round-2/dpo": 20, "round-2/revision-sft": 5}
    assert efficacy.cumulative_tokens(tokens, "untrained") == 0
    assert efficacy.cumulative_tokens(tokens, "sft") == 100
    assert efficacy.cumulative_tokens(tokens, "eto-round-1") == 110
    assert efficacy.cumulative_tokens(tokens, "agent-r-round-2") == 135
    assert efficacy.cumulative_tokens(tokens, "direct-revision") == 100  # trained off SFT
    # ET-Agent: warm start (sft), RFT, then curriculum stages of RL iterations.
    tokens = {"sft": 100, "rft": 30, "stage-1/iteration-1/rl": 7, "stage-1/iteration-2/rl": 8,
              "stage-2/iteration-1/rl": 50}  # fmt: skip
    assert efficacy.cumulative_tokens(tokens, "warm-start") == 100
    assert efficacy.cumulative_tokens(tokens, "rft") == 130
    assert efficacy.cumulative_tokens(tokens, "stage-1") == 145
    assert efficacy.cumulative_tokens(tokens, "stage-2") == 195
    assert efficacy.cumulative_tokens({"sft": 100, "round-1/rl": 9}, "rl-round-1") == 109


def test_orderings_mark_each_predicted_order_per_seed():
    rates = {
        0: {"eto:sft": 0.1, "eto:eto-round-1": 0.2, "eto:eto-round-2": 0.2,
            "agent-r:agent-r-round-2": 0.3},
        1: {"eto:sft": 0.2, "eto:eto-round-1": 0.2, "eto:eto-round-2": 0.1,
            "agent-r:agent-r-round-2": 0.0},
    }  # fmt: skip
    assert efficacy.orderings(rates, 2) == [
        "- seed 0: SFT < ETO round 1: holds, ETO round 1 <= round 2: holds, "
        "ETO round 2 <= Agent-R round 2: holds",
        "- seed 1: SFT < ETO round 1: does not hold, ETO round 1 <= round 2: does not hold, "
        "ETO round 2 <= Agent-R round 2: does not hold",
    ]
    # The RL recipes' runs alone: no ordering to check, so no line (the report leaves the
    # section out) rather than a "nothing to compare" per seed.
    assert efficacy.orderings({0: {"et-agent:rft": 0.5, "et-agent:stage-1": 0.6}}, 2) == []


def test_the_bootstrap_interval_is_a_point_when_every_seed_and_task_agree():
    solved = [{"a": True, "b": True}, {"a": True, "b": True}]
    assert efficacy.bootstrap_interval(solved, 200) == (1.0, 1.0)
    mixed = [{"a": True, "b": False}, {"a": True, "b": False}]
    low, high = efficacy.bootstrap_interval(mixed, 400)
    assert low == 0.0 and high == 1.0  # resampling tasks alone can pick only a, or only b


def test_every_budget_is_valid_settings_of_its_recipe(tmp_path):
    from flywheel.config_files import load_config

    assert set(efficacy.RECIPES) == {"eto", "agent-r", "agent-r1", "et-agent"}
    for gpu in (False, True):
        args = arguments(tmp_path, *(["--gpu"] if gpu else []))
        for recipe, (_, config) in efficacy.RECIPES.items():
            overrides = efficacy.recipe_settings(recipe, args)
            model = efficacy.config_model(recipe)
            settings = load_config(model, str(efficacy.ROOT / config), overrides)
            assert settings.rounds == 1  # `arguments`' --rounds
            if efficacy.ENVIRONMENT[recipe] == "qa":
                assert settings.env.name == "qa" and settings.env.validation_tasks == 40
                assert (settings.rl.frozen_layers == 0) == gpu
                continue
            assert settings.env.test_tasks == 26
            assert settings.env.validation_tasks == 20 and settings.env.train_tasks is None
            slices = settings.explore if recipe == "eto" else settings.mcts
            assert slices.tasks_per_round == (99 if gpu else 32)


def test_the_qa_recipes_hold_validation_questions_out_of_what_they_train_on(tmp_path):
    args = arguments(tmp_path)
    splits = efficacy.task_splits("agent-r1", efficacy.recipe_settings("agent-r1", args), 0)
    # Agent-R1's warm start takes every train question but the 40 held out (330 in all).
    assert {k: len(v) for k, v in splits.items()} == {"train": 290, "validation": 40, "test": 120}
    assert not set(splits["train"]) & set(splits["validation"])
    et_agent = efficacy.task_splits("et-agent", efficacy.recipe_settings("et-agent", args), 0)
    assert et_agent["validation"] == splits["validation"] and len(et_agent["test"]) == 100
    assert len(et_agent["train"]) == 64 and not set(et_agent["train"]) & set(splits["validation"])


def arguments(tmp_path, *extra):
    return efficacy.parse_args(
        ["--seeds", "0", "1", "--recipes", "eto", "--rounds", "1", "--store", str(tmp_path),
         "--out", str(tmp_path / "out.md"), "--bootstrap", "200", *extra]
    )  # fmt: skip


def test_the_split_flag_reaches_the_flows_and_validation_is_held_out_either_way(tmp_path):
    from flows.eto import ETOConfig
    from flywheel.config_files import load_config

    for split in ("test", "validation"):
        overrides = efficacy.recipe_settings("eto", arguments(tmp_path, "--split", split))
        config = str(efficacy.ROOT / efficacy.RECIPES["eto"][1])
        settings = load_config(ETOConfig, config, overrides)
        assert settings.evaluate.split == split
        # Tuning and reporting runs train on the same tasks: validation is held out in both.
        assert settings.env.validation_tasks == efficacy.VALIDATION_TASKS["textcraft"] == 20
        assert settings.env.train_tasks is None


def test_validation_test_and_train_tasks_are_disjoint_seeded_and_stable(tmp_path):
    args = arguments(tmp_path)
    splits = efficacy.task_splits("eto", efficacy.recipe_settings("eto", args), seed=0)
    assert {k: len(v) for k, v in splits.items()} == {"train": 79, "validation": 20, "test": 26}
    assert efficacy.task_splits("agent-r", efficacy.recipe_settings("agent-r", args), 1) == splits
    assert splits["validation"][:2] == ["birch_boat", "black_terracotta"]  # pinned


def test_a_planted_overlap_is_refused():
    efficacy.check_disjoint({"train": ["a", "b"], "validation": ["c"], "test": ["d"]})
    with pytest.raises(ValueError, match="the test and validation tasks share \\['c'\\]"):
        efficacy.check_disjoint({"train": ["a", "b"], "validation": ["c"], "test": ["c", "d"]})
    with pytest.raises(ValueError, match="the train and validation tasks share \\['b'\\]"):
        efficacy.check_disjoint({"train": ["a", "b"], "validation": ["b"], "test": ["d"]})


def test_paired_rows_pool_seeds_and_tasks():
    fails = {"a": False, "b": False, "c": False, "d": False}
    outcomes = {
        0: {"sft": [{**fails, "a": True}], "eto-round-1": [{**fails, "b": True, "c": True}]},
        1: {"sft": [{**fails, "a": True}], "eto-round-1": [{**fails, "a": True}]},
    }
    row = efficacy.paired_row("eto-round-1", "sft", outcomes, 400)
    # Seed 0: b and c gained, a lost; seed 1: no change. 8 cells, 2 gained, 1 lost.
    assert (row["cells"], row["gained"], row["lost"], row["difference"]) == (8, 2, 1, 0.125)
    assert row["p"] == 1.0  # 2 * (1 + 3) / 8, capped
    assert row["low"] < 0.125 < row["high"]
    assert efficacy.paired_row("eto-round-2", "sft", outcomes, 10) is None


def store_runs(store, args):
    return efficacy.StoreRuns(str(store), args.split)


def write_run(store, recipe, seed, stages, starts, folder="evaluate"):
    run = store / efficacy.run_name(recipe, seed)
    (run).mkdir(parents=True, exist_ok=True)
    (run / "results.json").write_text(json.dumps([{"stage": s} for s in stages]))
    paired = [{"stage": s, "started_from": f} for s, f in starts.items()]
    (run / "paired.json").write_text(json.dumps(paired))
    for stage, solved in stages.items():
        (run / folder / stage).mkdir(parents=True)
        lines = [json.dumps({"task_id": t, "success": ok}) for t, ok in solved.items()]
        (run / folder / stage / "trajectories.jsonl").write_text("\n".join(lines))


def test_the_report_gives_paired_rows_and_the_split_it_read(tmp_path):
    args = arguments(tmp_path, "--split", "validation")
    starts = {"sft": "untrained", "eto-round-1": "sft"}
    for seed in (0, 1):
        stages = {
            "untrained": {"a": False, "b": False},
            "sft": {"a": True, "b": False},
            "eto-round-1": {"a": True, "b": seed == 0},
        }
        write_run(tmp_path, "eto", seed, stages, starts, folder="evaluate-validation")
    efficacy.write_report(args, store_runs(tmp_path, args), [0, 1], {}, [])
    text = (tmp_path / "out.md").read_text()
    assert "Rates on the **validation** split (`--split validation`)." in text
    assert "- validation tasks (20): birch_boat, black_terracotta," in text
    assert "- test tasks (26): " in text
    assert "| eto | sft | untrained | 4 | 2 | 0 | +50.0% |" in text
    assert "| eto | eto-round-1 | sft | 4 | 1 | 0 | +25.0% |" in text
    assert (tmp_path / "out.png").stat().st_size > 0


def test_a_stage_some_seeds_did_not_reach_names_the_seeds_it_pools(tmp_path):
    """Seed 1's round 2 had nothing to train on, so its run ended at round 1: the round-2 row
    pools seed 0 alone and says so."""
    starts = {"sft": "untrained", "eto-round-1": "sft", "eto-round-2": "eto-round-1"}
    stages = {"untrained": {"a": False}, "sft": {"a": True}, "eto-round-1": {"a": True}}
    write_run(tmp_path, "eto", 0, {**stages, "eto-round-2": {"a": False}}, starts)
    write_run(tmp_path, "eto", 1, stages, starts)
    args = arguments(tmp_path)
    efficacy.write_report(args, store_runs(tmp_path, args), [0, 1], {}, [])
    text = (tmp_path / "out.md").read_text()
    assert "| 0/1 | 0% (seeds 0; not reached by seed 1) |" in text
    assert "| 2/2 | 100%, 100% |" in text  # round 1: both seeds, no note


def test_a_sampled_evaluation_gets_its_own_tables_pooled_over_seeds_and_samples(tmp_path):
    args = arguments(tmp_path)
    starts = {"sft": "untrained", "eto-round-1": "sft"}
    greedy = {"untrained": {"a": False, "b": False}, "sft": {"a": True, "b": False},
              "eto-round-1": {"a": True, "b": False}}  # fmt: skip
    # Two samples per task, a task's samples in a row (as `run_batched` stores them). Against
    # SFT, round 1 gains b in sample 1 on both seeds, and loses a in sample 0 on seed 1.
    sampled = {
        "untrained": [("a", False), ("a", False), ("b", False), ("b", False)],
        "sft": [("a", True), ("a", True), ("b", False), ("b", False)],
    }
    for seed in (0, 1):
        write_run(tmp_path, "eto", seed, greedy, starts)
        run = tmp_path / efficacy.run_name("eto", seed)
        (run / "results-sampled.json").write_text("[]")
        round_1 = [("a", seed == 0), ("a", True), ("b", False), ("b", True)]
        for stage, played in {**sampled, "eto-round-1": round_1}.items():
            folder = run / "evaluate-sampled" / stage
            folder.mkdir(parents=True)
            lines = [json.dumps({"task_id": t, "success": ok}) for t, ok in played]
            (folder / "trajectories.jsonl").write_text("\n".join(lines))
    efficacy.write_report(args, store_runs(tmp_path, args), [0, 1], {}, [])
    text = (tmp_path / "out.md").read_text()
    greedy_part, sampled_part = text.split("## Sampled episodes")
    assert "| eto | eto-round-1 | sft | 4 | 0 | 0 | +0.0% |" in greedy_part
    # 2 seeds x 2 samples x 2 tasks = 8 cells: 2 gained (b, sample 1), 1 lost (a, seed 1).
    assert "| eto | eto-round-1 | sft | 8 | 2 | 1 | +12.5% |" in sampled_part
    assert "| eto | sft | 50.0% |" in sampled_part and "| 4/8 | 50%, 50% |" in sampled_part


def test_tool_calls_per_correct_answer_pooled_and_paired_against_the_start(tmp_path):
    args = arguments(tmp_path)
    args.recipes = ["et-agent"]
    starts = {"rft": "warm-start", "stage-1": "rft"}
    played = {  # seed -> stage -> task -> (tool calls, solved)
        0: {"warm-start": {"a": (0, False), "b": (0, False)},
            "rft": {"a": (4, True), "b": (2, False)}, "stage-1": {"a": (2, True), "b": (1, False)}},
        1: {"warm-start": {"a": (1, False), "b": (0, False)},
            "rft": {"a": (4, True), "b": (4, True)}, "stage-1": {"a": (1, True), "b": (1, True)}},
    }  # fmt: skip
    for seed, stages in played.items():
        write_run(tmp_path, "et-agent", seed, {k: {} for k in stages}, starts)
        for stage, tasks in stages.items():
            lines = [
                json.dumps({"task_id": t, "success": ok, "metrics": {"tool_calls": calls}})
                for t, (calls, ok) in tasks.items()
            ]
            path = tmp_path / efficacy.run_name("et-agent", seed) / "evaluate" / stage
            (path / "trajectories.jsonl").write_text("\n".join(lines))
    lines = efficacy.efficiency_lines(args, store_runs(tmp_path, args), [0, 1], "")
    # RFT: 14 calls over 3 correct answers; stage 1: 5 over 3; the warm start answers nothing.
    assert "| et-agent | warm-start | – | – | – | – |" in lines
    assert lines[lines.index("| et-agent | warm-start | – | – | – | – |") + 1].startswith(
        "| et-agent | rft | 4.7 | warm-start | – | – (no correct answer on one side) |"
    )
    [stage_1] = [line for line in lines if line.startswith("| et-agent | stage-1 |")]
    assert stage_1.startswith("| et-agent | stage-1 | 1.7 | rft | -3.0 | ")
    # a stage without tool calls recorded (TextCraft's) has no row
    args.recipes = ["eto"]
    write_run(tmp_path, "eto", 0, {"sft": {"a": True}}, {})
    write_run(tmp_path, "eto", 1, {"sft": {"a": True}}, {})
    assert efficacy.efficiency_lines(args, store_runs(tmp_path, args), [0, 1], "") == []


def test_et_agents_later_stages_are_also_paired_against_rft(tmp_path):
    """ET-Agent's claim is against RFT, but stage 2 starts from stage 1: both rows are given."""
    order = ["warm-start", "rft", "stage-1", "stage-2"]
    starts = {"rft": "warm-start", "stage-1": "rft", "stage-2": "stage-1"}
    assert efficacy.compared_starts("et-agent", "stage-2", starts, order) == ["stage-1", "rft"]
    assert efficacy.compared_starts("et-agent", "stage-1", starts, order) == ["rft"]
    assert efficacy.compared_starts("et-agent", "rft", starts, order) == ["warm-start"]
    assert efficacy.compared_starts("et-agent", "warm-start", starts, order) == []
    eto = ["sft", "eto-round-1", "eto-round-2"]
    eto_starts = {"eto-round-1": "sft", "eto-round-2": "eto-round-1"}
    assert efficacy.compared_starts("eto", "eto-round-2", eto_starts, eto) == ["eto-round-1"]

    args = arguments(tmp_path)
    args.recipes = ["et-agent"]
    played = {  # stage -> task -> (tool calls, solved)
        "warm-start": {"a": (0, False), "b": (0, False)},
        "rft": {"a": (4, True), "b": (2, False)},
        "stage-1": {"a": (2, True), "b": (2, True)},
        "stage-2": {"a": (1, True), "b": (1, False)},
    }
    write_run(tmp_path, "et-agent", 0, {k: {} for k in played}, starts)
    for stage, tasks in played.items():
        lines = [
            json.dumps({"task_id": t, "success": ok, "metrics": {"tool_calls": calls}})
            for t, (calls, ok) in tasks.items()
        ]
        path = tmp_path / efficacy.run_name("et-agent", 0) / "evaluate" / stage
        (path / "trajectories.jsonl").write_text("\n".join(lines))
    # calls per correct answer: RFT 6 over 1, stage 1 4 over 2, stage 2 2 over 1
    stage_2 = [
        line
        for line in efficacy.efficiency_lines(args, store_runs(tmp_path, args), [0], "")
        if line.startswith("| et-agent | stage-2 |")
    ]
    assert [line.split(" | ")[2:5] for line in stage_2] == [
        ["2.0", "stage-1", "+0.0"],
        ["2.0", "rft", "-4.0"],
    ]
    _, paired, _, differences, _ = efficacy.variant_tables(
        args, store_runs(tmp_path, args), [0], ""
    )
    assert [line.split(" | ")[2:7] for line in paired if "| stage-2 |" in line] == [
        ["stage-1", "2", "0", "1", "-50.0%"],
        ["rft", "2", "0", "0", "+0.0%"],
    ]
    # the plot keeps one difference a stage: against its start
    assert [(d["stage"], d["start"]) for d in differences["et-agent"]] == [
        ("rft", "warm-start"), ("stage-1", "rft"), ("stage-2", "stage-1"),
    ]  # fmt: skip


def test_seeds_that_evaluated_different_tasks_are_refused_not_pooled():
    assert efficacy.bootstrap_interval([{"a": True, "b": False}, {"b": True, "a": True}], 50)
    with pytest.raises(ValueError, match="evaluated different tasks"):
        efficacy.bootstrap_interval([{"a": True, "b": False}, {"a": True, "c": True}], 50)


def write_tool_runs(store, seeds=(0, 1)):
    """ET-Agent runs with tool calls, tokens in a manifest and a sampled variant: every field
    the report reads from a run."""
    starts = {"rft": "warm-start", "stage-1": "rft"}
    for seed in seeds:
        run = store / efficacy.run_name("et-agent", seed)
        write_run(
            store, "et-agent", seed, {k: {} for k in ("warm-start", "rft", "stage-1")}, starts
        )
        played = {
            "warm-start": {"a": (0, False), "b": (1, False), "c": (0, seed == 1)},
            "rft": {"a": (4, True), "b": (2, False), "c": (3, True)},
            "stage-1": {"a": (2, True), "b": (1, seed == 0), "c": (2, False)},
        }
        for stage, tasks in played.items():
            lines = [
                json.dumps({"task_id": t, "success": ok, "metrics": {"tool_calls": calls}})
                for t, (calls, ok) in tasks.items()
            ]
            (run / "evaluate" / stage / "trajectories.jsonl").write_text("\n".join(lines))
            sampled = run / "evaluate-sampled" / stage
            sampled.mkdir(parents=True)
            twice = [line for line in lines for _ in range(2)]
            (sampled / "trajectories.jsonl").write_text("\n".join(twice))
        (run / "results-sampled.json").write_text("[]")
        (run / "sft").mkdir()
        manifest = {"metrics": {"tokens_per_epoch": 100 + seed, "epoch": 2}}
        (run / "sft" / "_MANIFEST.json").write_text(json.dumps(manifest))


def tables(text):
    """A report from its rates table on, less its plot's name: what the runs measured, not how
    the report was made."""
    lines = text[text.index("| recipe | stage | mean success") :].splitlines()
    return [line for line in lines if not line.startswith("![learning curve]")]


def test_per_seed_results_files_pool_into_the_report_of_all_seeds_run_together(tmp_path):
    """Seeds run on different machines, each bench writing its results file, pool into the
    report one bench over all seeds gives; nothing is read from the store."""
    store = tmp_path / "store"
    write_tool_runs(store)
    common = ["--recipes", "et-agent", "--rounds", "1", "--bootstrap", "200", "--store", str(store)]
    together = efficacy.parse_args(
        [*common, "--seeds", "0", "1", "--out", str(tmp_path / "all.md")]
    )
    efficacy.write_report(together, store_runs(store, together), [0, 1], {}, [])
    for seed in (0, 1):
        alone = efficacy.parse_args(
            [*common, "--seeds", str(seed), "--out", str(tmp_path / f"seed{seed}.md")]
        )
        efficacy.write_report(
            alone, store_runs(store, alone), [seed], {("et-agent", seed): 60.0}, []
        )
    saved = json.loads((tmp_path / "seed1.json").read_text())
    assert saved["runs"]["et-agent:1"]["tokens"] == {"sft": 202}
    assert "token_ids" not in json.dumps(saved)
    for path in (store, tmp_path / "all.md", tmp_path / "all.png"):
        (path.rename(path.with_name(path.name + ".gone")))
    efficacy.main(
        ["--from-results", str(tmp_path / "seed0.json"), str(tmp_path / "seed1.json"),
         "--out", str(tmp_path / "pooled.md"), "--bootstrap", "200"]
    )  # fmt: skip
    pooled = (tmp_path / "pooled.md").read_text()
    assert tables(pooled) == tables((tmp_path / "all.md.gone").read_text())
    assert "| et-agent | stage-1 | rft | 6 | 1 | 2 |" in pooled  # seeds x tasks pooled
    assert "## Sampled episodes" in pooled and "| 202 |" not in pooled  # tokens: mean 201
    assert f"- `{tmp_path / 'seed0.json'}`, from `python -m bench.efficacy" in pooled
    assert "et-agent seed 0: 1.0 min, et-agent seed 1: 1.0 min" in pooled
    assert not (tmp_path / "pooled.json").exists()  # its data are the files it pooled


def saved_file(path, runs, **settings):
    shared = {"split": "test", "rounds": 1, "set": [], "gpu": False, **settings}
    entry = {"episodes": {"": {}}, "starts": {}, "tokens": {}, "wall_s": 1.0}
    path.write_text(json.dumps({**shared, "command": "x", "runs": {r: entry for r in runs}}))
    return str(path)


def test_results_files_that_cannot_be_pooled_are_refused_with_the_reason(tmp_path):
    out = ["--out", str(tmp_path / "out.md")]
    first = saved_file(tmp_path / "a.json", ["agent-r1:0"])
    other_setting = saved_file(tmp_path / "b.json", ["agent-r1:1"], set=["rl.learning_rate=5e-5"])
    with pytest.raises(SystemExit, match="was run with set=.*pool only runs made with the same"):
        efficacy.main(["--from-results", first, other_setting, *out])
    other_split = saved_file(tmp_path / "c.json", ["agent-r1:1"], split="validation")
    with pytest.raises(SystemExit, match="split='validation'"):
        efficacy.main(["--from-results", first, other_split, *out])
    again = saved_file(tmp_path / "d.json", ["agent-r1:0"])
    with pytest.raises(SystemExit, match="holds agent-r1:0 .* again"):
        efficacy.main(["--from-results", first, again, *out])
    other_recipe = saved_file(tmp_path / "e.json", ["et-agent:1"])
    with pytest.raises(SystemExit, match="no run for agent-r1:1, et-agent:0"):
        efficacy.main(["--from-results", first, other_recipe, *out])
    assert not (tmp_path / "out.md").exists()


def test_the_report_reads_a_run_store_on_s3_as_it_reads_a_folder(tmp_path, s3_store):
    local = tmp_path / "store"
    write_tool_runs(local, seeds=(0,))
    s3_store.fs.put(str(local) + "/", "flywheel/runs/", recursive=True)
    on_disk, on_s3 = efficacy.StoreRuns(str(local)), efficacy.StoreRuns(s3_store.root)
    for read in ("episodes", "starts", "tokens"):
        assert getattr(on_s3, read)("et-agent", 0) == getattr(on_disk, read)("et-agent", 0)
    assert on_s3.tokens("et-agent", 0) == {"sft": 200}
    assert on_s3.has_variant("et-agent", 0, "sampled")
    assert not on_s3.has_variant("et-agent", 0, "harder")


def test_the_environment_flag_runs_eto_and_agent_r_from_the_qa_warm_start(tmp_path):
    from flywheel.config_files import load_config

    for recipe in ("eto", "agent-r"):
        args = arguments(tmp_path, "--environment", "qa", "--recipes", recipe)
        config = efficacy.recipe_config(recipe, args)
        assert config.endswith("_qa.yaml")
        overrides = efficacy.recipe_settings(recipe, args)
        # The QA config's own slice, not TextCraft's 32-task budget.
        assert not any("tasks_per_round" in o or "test_tasks" in o for o in overrides)
        settings = load_config(
            efficacy.config_model(recipe), str(efficacy.ROOT / config), overrides
        )
        assert settings.env.name == "qa" and settings.env.validation_tasks == 40
        splits = efficacy.task_splits(recipe, overrides, 0, config)
        agent_r1 = efficacy.task_splits(
            "agent-r1", efficacy.recipe_settings("agent-r1", arguments(tmp_path)), 0
        )
        assert splits["validation"] == agent_r1["validation"]  # the same held-out questions
    with pytest.raises(SystemExit, match="no config"):
        efficacy.recipe_config("agent-r1", arguments(tmp_path, "--environment", "textcraft"))
