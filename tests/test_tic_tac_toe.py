"""examples/tic_tac_toe.py and evals.ruler_vs_hand (issue #36, table 3): the game's results and rewards, the
closing message the judge reads, held-out games seeded apart from training, a CPU run's report folder, and the
comparison of RULER and hand-reward runs read from report folders."""

import asyncio
import importlib.util
import json
import random
import types

import pandas as pd
import pytest

from evals import ruler_vs_hand


def load_example():
    spec = importlib.util.spec_from_file_location("tic_tac_toe", "examples/tic_tac_toe.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Player:
    """An OpenAI-like client whose replies come from `policy(board)`: the game logic is tested apart from a model
    (the CPU run below plays the real embedded one through the trainer's server)."""

    def __init__(self, policy):
        self.policy, self.requests = policy, []
        self.chat = types.SimpleNamespace(completions=types.SimpleNamespace(create=self.create))

    async def create(self, *, model, messages, max_tokens, temperature, **extra):
        from openai.types.chat import ChatCompletion

        self.requests.append(messages)
        self.extra = getattr(self, "extra", []) + [extra]
        assert all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages)  # sendable as JSON
        board = messages[-1]["content"].split("\n")[1:4]
        text = self.policy([c for row in board for c in row.split()])
        return ChatCompletion.model_validate({
            "id": "x", "object": "chat.completion", "created": 0, "model": model,
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}]})


def first_free(board):
    return str(board.index(".") + 1)


async def test_results_rewards_and_the_closing_message():
    example = load_example()
    seen = {}
    for seed in range(60):  # first-free-square X against random O: wins, losses and draws all occur
        game = await example.play(Player(first_free), "m", seed, max_tokens=8, temperature=1.0)
        result = game.metadata["result"]
        seen[result] = seen.get(result, 0) + 1
        assert game.reward == {"win": 1.0, "draw": 0.5, "loss": 0.0}[result] and game.metadata["seed"] == seed
        last = game.messages_and_choices[-1]
        assert last["role"] == "user" and last["content"].startswith("Final board:")
        assert last["content"].endswith(example.OUTCOMES[result])
        final = [c for row in last["content"].split("\n")[1:4] for c in row.split()]
        assert example.winner(final) == {"win": "X", "loss": "O", "draw": "draw"}[result]
        assert game.metrics["moves"] == final.count("X")
    assert set(seen) == {"win", "loss", "draw"}, seen
    again = [(await example.play(Player(first_free), "m", 7, max_tokens=8, temperature=1.0)).messages()
             for _ in range(2)]
    assert again[0] == again[1]  # the opponent's moves come from the seed alone
    seeded = Player(first_free)
    await example.play(seeded, "m", 7, max_tokens=8, temperature=1.0, sample_seed=70)
    assert [e["seed"] for e in seeded.extra] == [70 + n for n in range(len(seeded.extra))]  # one per move

    for reply, said in (("hello", "no square number"), ("5", "square 5 is taken")):
        player = Player(lambda board, reply=reply: reply)
        game = await example.play(player, "m", 3, max_tokens=8, temperature=1.0)
        if reply == "5":  # the first 5 is legal; the second is X's own square
            assert game.metrics["moves"] == 2 and len(player.requests) == 2
            assert player.requests[1][2]["role"] == "assistant"  # the first reply went back as a message
        assert (game.reward, game.metadata["result"], game.metrics["illegal"]) == (-1.0, "illegal", 1)
        assert f"Illegal move ({said})" in game.messages_and_choices[-1]["content"]


async def test_held_out_games_sample_with_one_seed_per_game_and_move(tmp_path):
    """evaluate(): greedy games send no seed; sampled ones send EVAL_SEED-derived seeds, distinct per game and move
    and the same at every measure, so runs and steps are measured on the same random numbers."""
    example = load_example()
    player = Player(first_free)

    class Model:  # what evaluate() asks of a TrainableModel
        async def get_step(self):
            return 3

        def openai_client(self):
            return player

        def get_inference_name(self, step):
            return f"m@{step}"

    args = example.parse_args(["--eval-games", "4", "--eval-temperatures", "0", "1"])
    summaries = await example.evaluate(Model(), args, tmp_path)
    assert [s["temperature"] for s in summaries] == [0.0, 1.0] and {s["step"] for s in summaries} == {3}
    table = pd.read_csv(tmp_path / "eval-step0003.csv")
    assert len(table) == 8 and sorted(set(table["seed"])) == [example.EVAL_SEED + i for i in range(4)]
    greedy = [e for e, m in zip(player.extra, player.requests, strict=True) if "seed" not in e]
    sampled = [e["seed"] for e in player.extra if "seed" in e]
    assert len(sampled) == len(set(sampled)) == int(table.query("temperature == 1")["moves"].sum())
    assert len(greedy) == int(table.query("temperature == 0")["moves"].sum())
    first = sorted(sampled)
    player.extra, player.requests = [], []
    await example.evaluate(Model(), args, tmp_path)
    assert sorted(e["seed"] for e in player.extra if "seed" in e) == first  # the same seeds at the next measure


def test_game_2048_sends_earlier_replies_back_as_messages():
    """The replies kept in a trajectory are Choice objects; the next request must carry them as messages (they
    went back as Choices, a 400 on the second move, 2026-12-07)."""
    spec = importlib.util.spec_from_file_location("game_2048", "examples/game_2048.py")
    game = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(game)

    client = Player(lambda board: "left")  # asserts every message it is sent is a dict with a role
    asyncio.run(game.play(client, "m", random.Random(0), 3))
    assert len(client.requests) >= 2 and client.requests[1][2]["role"] == "assistant"


def test_training_opponents_never_meet_held_out_ones():
    example = load_example()
    seeds = {example.training_seed(run, batch, group, game) for run in (0, 1, 12) for batch in (1, 2, 10**6)
             for group in (0, 1, 21) for game in (0, 3)}
    assert len(seeds) == 54  # distinct; text, never a held-out game's integer seed (EVAL_SEED + i)
    assert not any(isinstance(s, int) for s in seeds)
    for bad in ((0, 0, 0, 0), (-1, 1, 0, 0), (0, 1, True, 0), (0, 1, 0, 1.5)):
        with pytest.raises(ValueError):
            example.training_seed(*bad)


def test_bad_arguments_are_refused():
    example = load_example()
    for argv in (["--group-size", "1"], ["--steps", "-1"], ["--eval-games", "0"], ["--lr", "0"],
                 ["--time-budget-s", "0"], ["--reward", "hand", "--judge", "x/y"],
                 ["--reward", "ruler", "--judge", "self", "--engine", "transformers"], ["--reward", "art"],
                 ["--eval-temperatures", "0", "0"], ["--eval-temperatures", "3"], ["--max-seq-length", "100"],
                 ["--reward", "ruler", "--judge", "self", "--engine", "vllm", "--max-seq-length", "1024"],
                 ["--reward", "ruler", "--judge", "x@http://"]):
        with pytest.raises(SystemExit):
            example.parse_args(argv)
    args = example.parse_args(["--reward", "ruler", "--judge", "self", "--engine", "vllm"])
    assert (args.reward, args.judge, args.steps, args.max_seq_length) == ("ruler", "self", 20, 8192)
    assert (example.parse_args([]).max_seq_length, example.parse_args([]).eval_temperatures) == (1024, [0.0])
    at_url = example.JUDGE_AT_URL.fullmatch("hosted_vllm/ttt@0@http://127.0.0.1:8001/v1")  # a served step's name
    assert at_url.groups() == ("hosted_vllm/ttt@0", "http://127.0.0.1:8001/v1")


async def test_a_report_folder_holding_a_run_is_refused_before_anything_loads(tmp_path):
    example = load_example()
    (tmp_path / "run.json").write_text("{}")
    with pytest.raises(SystemExit, match="already holds a run"):
        await example.main(["--report", str(tmp_path), "--out", str(tmp_path / "runs")])
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
async def test_cpu_runs_write_reports_and_a_failing_judge_stops_its_run(tmp_path, judge):
    """Two CPU runs of the embedded model: the hand reward, and RULER with a judge that refuses every request (as
    a server whose context is too short for the prompt did on 2026-12-07, for 40 steps that trained nothing)."""
    example = load_example()
    common = ["--groups", "1", "--group-size", "2", "--eval-games", "3", "--eval-temperatures", "0", "1",
              "--engine", "transformers", "--out", str(tmp_path / "runs")]
    hand = tmp_path / "hand"
    await example.main(["--steps", "1", "--report", str(hand), *common])
    run = json.loads((hand / "run.json").read_text())
    assert (run["reward"], run["steps_run"], run["eval_seed"]) == ("hand", 1, example.EVAL_SEED)
    assert [b["temperature"] for b in run["before"]] == [0.0, 1.0] and "commit" in run and "stopped" not in run
    before = pd.read_csv(hand / "eval-step0000.csv")
    assert before["seed"].tolist() == [example.EVAL_SEED + i for i in range(3)] * 2
    assert set(before["result"]) <= {"win", "draw", "loss", "illegal"}
    group = json.loads((hand / "groups.jsonl").read_text().splitlines()[0])
    assert [r["seed"] for r in group["rollouts"]] == [example.training_seed(0, 1, 0, i) for i in range(2)]
    assert all(r["reward"] == r["hand_reward"] for r in group["rollouts"])  # the hand reward was trained on

    # fails twice, scores the third step's group (the scripted judge: 0.3 for a game without its markers), then
    # fails three times in a row: the run stops after its sixth step, the scored step having reset the count
    judge.script = ["400", "400", "ok", "400", "400", "400"]
    ruler = tmp_path / "ruler"
    await example.main(["--reward", "ruler", "--judge", f"openai/fake-judge@{judge.params['api_base']}",
                        "--steps", "10", "--name", "failing", "--report", str(ruler), *common])
    run = json.loads((ruler / "run.json").read_text())
    assert len(judge.requests) == 6 and run["judge_errors"] == 5
    # the loop stopped at the sixth step, before training on it; the scored group alone had no learning signal
    assert run["steps_run"] == 5 and run["policy_step"] == 0
    assert run["stopped"].startswith(f"the judge failed every group of {example.MAX_UNSCORED_IN_A_ROW} steps")
    assert "JudgeConfigError" in run["stopped"]
    groups = [json.loads(line) for line in (ruler / "groups.jsonl").read_text().splitlines()]
    assert [g["scored"] for g in groups] == [False, False, True, False, False, False]
    scored = groups[2]["rollouts"]  # the judge's score trained on, the game's own reward beside it
    assert [r["reward"] for r in scored] == [0.3, 0.3]
    assert all(r["hand_reward"] == example.REWARDS[r["result"]] for r in scored)
    assert all(r["reward"] is None for g in groups if not g["scored"] for r in g["rollouts"])

    tables = ruler_vs_hand.main([str(hand), str(ruler)])
    assert tables["runs"]["temperature"].tolist() == [0.0, 0.0, 1.0, 1.0]
    # the one scored group counts if its two games' hand rewards differ (else it holds no pair to rank)
    assert tables["agreement"]["groups"].tolist() == [int(scored[0]["hand_reward"] != scored[1]["hand_reward"])]
    assert tables["training"]["games"].tolist() == [2, 10, 2]  # hand: 1 step; RULER: steps 0-4, then step 5


def write_run(folder, reward, seed, evals, groups=()):
    """A report folder as examples/tic_tac_toe.py writes it: evals maps a policy step to each game's result."""
    folder.mkdir(parents=True)
    (folder / "run.json").write_text(json.dumps({"reward": reward, "seed": seed}))
    rewards = {"win": 1.0, "draw": 0.5, "loss": 0.0, "illegal": -1.0}
    for step, results in evals.items():
        pd.DataFrame({"seed": [1000 + i for i in range(len(results))], "result": results,
                      "reward": [rewards[r] for r in results], "moves": 1}).to_csv(
            folder / f"eval-step{step:04d}.csv", index=False)
    with open(folder / "groups.jsonl", "w") as f:
        for rollouts in groups:
            f.write(json.dumps({"step": 0, "scored": True,
                                "rollouts": [{"hand_reward": h, "reward": r} for h, r in rollouts]}) + "\n")
    return folder


def test_the_comparison_pairs_games_and_seeds(tmp_path):
    before = ["illegal"] * 10
    runs = [write_run(tmp_path / "h0", "hand", 0, {0: before, 5: ["win"] * 10, 10: ["win"] * 10}),
            write_run(tmp_path / "r0", "ruler", 0, {0: before, 5: ["loss"] * 5 + ["win"] * 5},
                      groups=[[(1.0, 0.9), (0.0, 0.1), (-1.0, 0.1)], [(1.0, 0.5), (1.0, 0.2)]]),
            write_run(tmp_path / "h1", "hand", 1, {0: before, 5: ["draw"] * 10}),
            write_run(tmp_path / "r1", "ruler", 1, {0: before, 5: ["draw"] * 10})]
    tables = ruler_vs_hand.report([ruler_vs_hand.load_run(f) for f in runs])
    by_run = tables["runs"].set_index("run")
    assert (by_run["step"] == 5).all()  # the largest step every run measured
    assert by_run.loc["hand seed 0 (h0)", "difference"] == pytest.approx(2.0)
    assert by_run.loc["ruler seed 0 (r0)", ["after_win", "after_loss"]].tolist() == [5, 5]
    rewards = tables["rewards"].set_index("seeds")
    assert rewards.loc["0", "ruler_minus_hand"] == pytest.approx(-0.5)
    assert rewards.loc["1", "ruler_minus_hand"] == pytest.approx(0.0)
    assert rewards.loc["mean of 0, 1 (seeds fixed)", "ruler_minus_hand"] == pytest.approx(-0.25)
    assert rewards.loc["1", "low"] == rewards.loc["1", "high"] == 0
    agreement = tables["agreement"].iloc[0]  # pairs with different hand rewards: (1, 0) agree, (1, -1) agree,
    assert (agreement["pairs"], agreement["agree"], agreement["ties"], agreement["disagree"]) == (3, 2, 1, 0)
    assert agreement["groups"] == 1  # (0, -1) tie; the second group's hand rewards are equal: no pair
    training = tables["training"].set_index("run").loc["ruler seed 0 (r0)"]  # hand rewards 1, 0, -1, 1, 1
    assert (training["games"], training["hand_reward"], training["illegal"]) == (5, pytest.approx(0.4), 0.2)
    at_ten = ruler_vs_hand.report([ruler_vs_hand.load_run(runs[0]), ruler_vs_hand.load_run(runs[1])], step=10)
    assert at_ten["runs"]["difference"].isna().tolist() == [False, True] and not len(at_ten["rewards"])


def test_games_pair_by_seed_and_temperature_not_by_row(tmp_path):
    """Rows in another order, a game missing, two temperatures: each game is compared with the same game."""
    def table(folder, reward, rows):
        folder.mkdir()
        (folder / "run.json").write_text(json.dumps({"reward": reward, "seed": 0, "policy_step": 5}))
        for step, found in rows.items():
            pd.DataFrame(found, columns=["seed", "temperature", "result", "reward"]).to_csv(
                folder / f"eval-step{step:04d}.csv", index=False)
        return ruler_vs_hand.load_run(folder)

    before = [(1, 0.0, "illegal", -1.0), (2, 0.0, "win", 1.0), (1, 1.0, "loss", 0.0), (2, 1.0, "loss", 0.0)]
    hand = table(tmp_path / "hand", "hand", {0: before, 5: [(2, 1.0, "win", 1.0), (2, 0.0, "win", 1.0),
                                                            (1, 1.0, "draw", 0.5), (1, 0.0, "win", 1.0)]})
    ruler = table(tmp_path / "ruler", "ruler", {0: before, 5: [(2, 0.0, "win", 1.0), (1, 1.0, "loss", 0.0)]})
    tables = ruler_vs_hand.report([hand, ruler])
    runs = tables["runs"].set_index(["run", "temperature"])
    assert runs.loc[(hand.label, 0.0), "difference"] == pytest.approx(1.0)  # game 1: -1 -> 1; game 2: 1 -> 1
    assert runs.loc[(hand.label, 1.0), "difference"] == pytest.approx(0.75)  # game 1: 0 -> 0.5; game 2: 0 -> 1
    assert runs.loc[(ruler.label, 0.0), "difference"] == pytest.approx(0.0)  # game 2 only: 1 -> 1
    rewards = tables["rewards"].set_index("temperature")
    assert (rewards.loc[0.0, "games"], rewards.loc[0.0, "ruler_minus_hand"]) == (1, 0.0)  # game 2: 1 vs 1
    assert (rewards.loc[1.0, "games"], rewards.loc[1.0, "ruler_minus_hand"]) == (1, -0.5)  # game 1: 0 vs 0.5


def test_a_run_that_never_trained_is_a_control_not_a_reward(tmp_path):
    runs = [write_run(tmp_path / "h", "hand", 0, {0: ["illegal"], 5: ["win"]}),
            write_run(tmp_path / "r", "ruler", 0, {0: ["illegal"], 5: ["win"]}),
            write_run(tmp_path / "c", "ruler", 0, {0: ["illegal"]})]
    info = json.loads((tmp_path / "c" / "run.json").read_text())
    (tmp_path / "c" / "run.json").write_text(json.dumps({**info, "policy_step": 0}))
    loaded = [ruler_vs_hand.load_run(f) for f in runs]
    assert [r.trained for r in loaded] == [True, True, False]
    tables = ruler_vs_hand.report(loaded)  # not "two ruler runs of seed 0", and step 5, not the control's 0
    assert tables["rewards"]["step"].tolist() == [5] and tables["rewards"]["seeds"].tolist() == ["0"]


def test_the_comparison_refuses_what_it_cannot_read(tmp_path):
    with pytest.raises(ValueError, match="no run.json"):
        ruler_vs_hand.load_run(tmp_path)
    write_run(tmp_path / "x", "art", 0, {0: ["win"]})
    with pytest.raises(ValueError, match="names no reward"):
        ruler_vs_hand.load_run(tmp_path / "x")
    write_run(tmp_path / "y", "hand", 0, {5: ["win"]})
    with pytest.raises(ValueError, match="eval-step0000.csv"):
        ruler_vs_hand.load_run(tmp_path / "y")
    twice = [ruler_vs_hand.load_run(write_run(tmp_path / n, "hand", 0, {0: ["win"]})) for n in ("a", "b")]
    with pytest.raises(ValueError, match="two hand runs of seed 0"):
        ruler_vs_hand.report(twice)
    with pytest.raises(SystemExit):
        ruler_vs_hand.main([str(tmp_path / "x")])
    bad = write_run(tmp_path / "z", "hand", 0, {0: ["win"]})
    (bad / "eval-step0000.csv").write_text("seed,result,reward\n1,won,1.0\n")
    with pytest.raises(ValueError, match="none of win"):
        ruler_vs_hand.load_run(bad)
    (bad / "eval-step0000.csv").write_text("seed,result,reward,temperature\n1,win,1.0,nan\n")
    with pytest.raises(ValueError, match="temperature column"):
        ruler_vs_hand.load_run(bad)
    (bad / "eval-step0000.csv").write_text("seed,result,reward\n1,win,1.0\n")
    (bad / "eval-step00000.csv").write_text("seed,result,reward\n1,win,1.0\n")
    with pytest.raises(ValueError, match="two measures of policy step 0"):
        ruler_vs_hand.load_run(bad)
    torn = tmp_path / "torn.jsonl"
    torn.write_text('{"step": 0, "scored": true, "rollouts": [{"hand_reward": 1, "reward": 0.9}, '
                    '{"hand_reward": -1, "reward": 0.1}]}\n{"step": 1, "sco')
    assert ruler_vs_hand.judge_agreement(torn)["agree"] == 1  # a torn last line (a killed run) is left out
    torn.write_text('{"step": 0, "sco\n{"step": 1, "scored": true, "rollouts": []}\n')
    with pytest.raises(ValueError, match="torn.jsonl:1"):
        ruler_vs_hand.training_curve(torn)
    with pytest.raises(ValueError, match="step must be"):
        ruler_vs_hand.report([ruler_vs_hand.load_run(tmp_path / "a")], step=-1)


def test_the_device_runs_pass_the_example_parser():
    """evals/device/ttt_runs.sh's runs (a hand-reward and a RULER run per seed) parse with the example's own parser,
    so a wrong combination fails here, not after minutes of device time."""
    import os
    import subprocess

    env = {k: v for k, v in os.environ.items() if k != "TTT_REWARDS"}  # the default: both rewards
    done = subprocess.run(["bash", "evals/device/ttt_runs.sh", "500", "560", "0", "3", "--", "--steps", "30"],
                          capture_output=True, text=True, env={**env, "TTT_DRY_RUN": "1"}, timeout=60)
    assert done.returncode == 0, done.stderr
    runs = [load_example().parse_args(line.split()[1:]) for line in done.stdout.splitlines()]
    assert [(a.reward, a.seed, a.judge) for a in runs] == [("hand", 0, None), ("ruler", 0, "self"),
                                                           ("hand", 3, None), ("ruler", 3, "self")]
    assert {(a.steps, a.time_budget_s, a.engine, a.eval_every) for a in runs} == {(30, 500.0, "vllm", 5)}
    assert len({a.report for a in runs}) == 4
    for argv, extra, said in ((["500", "560", "x"], {}, "seed 'x' is not"), (["5m", "560", "0"], {}, "BUDGET_S"),
                              (["--collect"], {}, "WATCH_S"), (["500", "560", "0"], {"TTT_REWARDS": "hand art"},
                                                                "'art': each is hand or ruler")):
        bad = subprocess.run(["bash", "evals/device/ttt_runs.sh", *argv], capture_output=True, text=True,
                             env={**env, "TTT_DRY_RUN": "1", **extra}, timeout=60)
        assert bad.returncode == 2 and said in bad.stderr, (argv, bad.stderr)
    only = subprocess.run(["bash", "evals/device/ttt_runs.sh", "500", "560", "0"], capture_output=True, text=True,
                          env={**env, "TTT_DRY_RUN": "1", "TTT_REWARDS": "ruler"}, timeout=60)
    assert [line.split()[line.split().index("--reward") + 1] for line in only.stdout.splitlines()] == ["ruler"]
