"""`specserve validate`: the two-sample test on synthetic data, the tool on the tiny zoo (a lossless
path passes, a draft that misreports q fails, on its sampled test alone), the command line, and the
profile it writes read back as the routing policy's priors.

Measured when this was written (tiny zoo, the sql task's two held-out prompts, the general draft,
temperature 1.0, one test per run at a level of 0.01, seeds 0-9 per setting): a draft reporting its
argmax's one-hot q while sampling from its full q was rejected in 10 of 10 runs at 40 samples per
side (z above the critical z by 0.8-4.6) and in 10 of 10 at 60 (by 4.0-7.5); a one-hot q of the
sampled token (lossless) in 0 of 10 at 40 and 60; the correct path in 0 of 10 at 40 and 1 of 10 at
60, and its p-values over 60 seeds at 60 samples were uniform (1 at <= 0.01, 4 at <= 0.05, 7 at
<= 0.1).
"""

import itertools
import json

import numpy as np
import pytest
import torch

from specserve.cluster.cli import main
from specserve.cluster.config import ServiceConfig
from specserve.cluster.models import resolve_models
from specserve.cluster.two_sample import permutation_test
from specserve.cluster.validate import validate
from specserve.cluster.validate_report import Settings
from specserve.cluster.validate_runs import Prompt, engine_decoder, read_prompts
from specserve.workers import drafting
from specserve.workers.acceptance import one_hot, sample_sparse, sparsify, warp

SAMPLES = 60  # per prompt and side: the misreported q is rejected ~5 sd beyond the critical value (see above)


# --- the two-sample test, no models ----------------------------------------------------------------------


def test_the_statistic_is_pearsons_chi_square_of_homogeneity():
    from scipy.stats import chi2_contingency

    rng = np.random.default_rng(0)
    a, b = rng.integers(0, 6, (50, 1)), rng.integers(0, 6, (70, 1))
    table = [[(a == x).sum() for x in range(6)], [(b == x).sum() for x in range(6)]]
    expected = chi2_contingency(table, correction=False).statistic
    assert permutation_test([(a, b)], 10, rng).statistic == pytest.approx(expected)


def test_the_permutation_p_value_is_the_exact_one():
    """Three draws a side: all 20 relabellings enumerated give the exact p; 20,000 random ones agree."""
    a, b = np.array([[0], [0], [1]]), np.array([[1], [2], [2]])
    exact = permutation_test([(a, b)], 1, np.random.default_rng(0))
    outcomes = np.concatenate([a, b])
    null = [permutation_test([(outcomes[list(side)], outcomes[[i for i in range(6) if i not in side]])], 1,
                             np.random.default_rng(0)).statistic for side in itertools.combinations(range(6), 3)]
    exact_p = np.mean(np.array(null) >= exact.statistic - 1e-9)
    assert permutation_test([(a, b)], 20_000, np.random.default_rng(1)).p_value == pytest.approx(exact_p, abs=0.01)


def test_a_lossless_pair_is_rejected_at_most_at_its_level_and_a_different_one_always():
    """Two prompts (strata) of diverse outputs, 20 draws a side: under H0 the rejection rate at 0.05
    over 300 trials stays within three binomial standard deviations of 0.05."""
    rng = np.random.default_rng(2)
    rejected = 0
    for _ in range(300):
        dists = [rng.dirichlet(np.full(40, 0.3)) for _ in range(2)]
        strata = [(rng.choice(40, (20, 2), p=d), rng.choice(40, (20, 2), p=d)) for d in dists]
        rejected += permutation_test(strata, 200, rng).p_value <= 0.05
    assert rejected / 300 <= 0.05 + 3 * (0.05 * 0.95 / 300) ** 0.5
    d, e = rng.dirichlet(np.full(40, 0.3)), rng.dirichlet(np.full(40, 0.3))
    result = permutation_test([(rng.choice(40, (20, 2), p=d), rng.choice(40, (20, 2), p=e))], 999, rng)
    assert result.p_value == 1 / 1000 and result.z() > result.z(result.critical(0.01))


# --- the tool on the tiny zoo, in process ----------------------------------------------------------------


def sql_prompts(zoo) -> list[Prompt]:
    return [Prompt(text, "sql") for text in zoo.prompts("sql")[:2]]


def test_the_zoo_pair_is_equivalent(tiny_zoo, tiny_engine):
    prompts = sql_prompts(tiny_zoo)
    drafts = list(tiny_zoo.manifest["task_drafts"]["sql"])  # sql, general, eagle3 (a head)
    report = validate(engine_decoder(tiny_engine, 4), prompts, [drafts] * 2,
                      Settings(temperatures=(1.0,), samples=40, max_tokens=32, seed=0))
    assert report.equivalent and not report.mismatches and report.greedy_runs == 2 * len(drafts) == 6
    assert [(t.task, t.draft) for t in report.tests] == [("sql", d) for d in drafts]
    assert all(t.z < t.z_critical for t in report.tests)
    assert set(report.profile["sql"]) == set(drafts)
    rows = {row["draft"]: row for row in report.as_dict()["tasks"]}
    assert rows["sql"]["identical"] == 2 and rows["sql"]["measured_speedup"] > 0 and rows["sql"]["cost_ratio"] > 0
    assert 0 <= rows["sql"]["alpha_sampled"]["1.0"] <= 1 and rows["sql"]["expected_speedup"] > 0


def draft_reporting(which_q):
    """DraftSession.draw that samples from its true truncated q but reports ``which_q(logits, token)``."""
    honest = drafting.DraftSession.draw

    def draw(self, logits, position):
        if self.sampling.greedy:
            return honest(self, logits, position)
        q = sparsify(warp(logits, self.sampling), self.max_support)
        token = sample_sparse(q, self.draws.uniform(position))
        return token, which_q(logits, token)
    return draw


def test_a_draft_that_misreports_q_fails_on_its_samples_alone(tiny_zoo, tiny_engine, monkeypatch):
    """The greedy branch's q (the argmax, one-hot) reported for a sampled token: every token that is
    not the argmax has q = 0 on the wire, so it is always accepted and the output drifts towards the
    draft's distribution. Greedy is untouched, so it is the sampled test that must catch it, by a
    margin, not by luck."""
    argmax_q = draft_reporting(lambda logits, token: one_hot(logits[0].argmax()))
    monkeypatch.setattr(drafting.DraftSession, "draw", argmax_q)
    report = validate(engine_decoder(tiny_engine, 4), sql_prompts(tiny_zoo), [["general"]] * 2,
                      Settings(temperatures=(1.0,), samples=SAMPLES, max_tokens=32, seed=0))
    assert not report.mismatches  # greedy identical: q does not matter there
    (test,) = report.tests
    assert not report.equivalent and report.rejected == [test]
    assert test.z > test.z_critical + 2, test  # measured: 4.0-7.5 sd beyond over 10 seeds
    assert report.pairings[0].sampled[1.0].alpha > 0.9  # the tell: nearly everything accepted


def test_a_one_hot_q_of_the_sampled_token_is_lossless_and_passes(tiny_zoo, tiny_engine, monkeypatch):
    sampled_q = draft_reporting(lambda logits, token: one_hot(torch.tensor(token)))
    monkeypatch.setattr(drafting.DraftSession, "draw", sampled_q)
    report = validate(engine_decoder(tiny_engine, 4), sql_prompts(tiny_zoo), [["general"]] * 2,
                      Settings(temperatures=(1.0,), samples=SAMPLES, max_tokens=32, seed=0))
    assert report.equivalent, report.summary()


# --- the command line ----------------------------------------------------------------------------------------


def test_validate_command_writes_a_report_and_a_profile_the_service_starts_from(tiny_zoo, tmp_path, capsys):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": tiny_zoo.prompts("math")[0], "task": "math"}) + "\n")
    out, profile = tmp_path / "report.json", tmp_path / "profile.json"
    code = main(["validate", "--zoo", str(tiny_zoo.root), "--prompts", str(prompts), "--draft", "math",
                 "--temperatures", "1.0", "--samples", "10", "--max-tokens", "16", "--seed", "0", "--out", str(out),
                 "--profile", str(profile)])
    err = capsys.readouterr().err
    assert code == 0, err
    report = json.loads(out.read_text())
    assert report["equivalent"] and report["greedy"]["identical"] and report["sampled"]["rejected"] == 0
    assert [(t["task"], t["draft"]) for t in report["tasks"]] == [("math", "math")]
    assert "EQUIVALENT" in err and f"profile written to {profile}" in err
    assert json.loads(profile.read_text()) == report["profile"] == {"math": {"math": report["tasks"][0]["alpha"]}}
    config = ServiceConfig.model_validate({"models": {"zoo": str(tiny_zoo.root), "priors": str(profile)}})
    priors = resolve_models(config.models, config.router).priors
    assert priors["math"]["math"] == report["tasks"][0]["alpha"]  # the profile's, over the zoo's
    assert priors["sql"] == tiny_zoo.manifest["acceptance"]["sql"]  # the zoo's, where the profile says nothing


def test_validate_command_takes_your_own_models_and_plain_text_prompts(tiny_zoo, tmp_path, capsys):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text(tiny_zoo.prompts("sql")[0].replace("\n", " ") + "\n\n")
    code = main(["validate", "--target", str(tiny_zoo.target_dir), "--draft", f"mine={tiny_zoo.draft_dir('sql')}",
                 "--task", "db=mine", "--task", "db", "--prompts", str(prompts), "--temperatures", "0.7",
                 "--samples", "10", "--max-tokens", "8", "--seed", "0"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    # the draft-free proposers beside the table's draft, as the service serves it
    assert [(t["task"], t["draft"]) for t in json.loads(captured.out)["tasks"]] == [("db", d) for d in ("mine", "ngram",
                                                                                                       "suffix")]


def test_validate_runs_every_proposer_in_process_trees_included(tiny_zoo, tmp_path, capsys):
    """The draft-free proposers and the token tree run on the in-process loop as the service runs them:
    greedy identical, the sampled tests pass, and only the draft model enters the profile."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text(tiny_zoo.prompts("sql")[0].replace("\n", " ") + "\n")
    profile = tmp_path / "profile.json"
    code = main(["validate", "--target", str(tiny_zoo.target_dir), "--draft", f"mine={tiny_zoo.draft_dir('sql')}",
                 "--task", "db=mine,ngram,suffix,tree", "--prompts", str(prompts), "--temperatures", "1.0",
                 "--samples", "10", "--max-tokens", "16", "--seed", "0", "--profile", str(profile)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    report = json.loads(captured.out)
    assert [t["draft"] for t in report["sampled"]["tests"]] == ["mine", "ngram", "suffix", "tree"]
    assert report["greedy"]["runs"] == 4 and report["greedy"]["identical"]
    rows = {row["draft"]: row for row in report["tasks"]}
    assert rows["tree"]["identical"] == 1 and rows["tree"]["alpha"] >= rows["mine"]["alpha"]  # the tree holds mine
    assert json.loads(profile.read_text()) == {"db": {"mine": rows["mine"]["alpha"]}}


def test_a_zoo_task_is_validated_with_its_drafts_and_the_draft_free_proposers(tiny_zoo):
    from specserve.cluster.model_args import OwnModels
    from specserve.cluster.validate_models import local_arms, local_models

    models = local_models(str(tiny_zoo.root), OwnModels(), None)
    prompts, arms = local_arms(models, [Prompt("SELECT", "sql")], None)
    assert arms == [["sql", "general", "eagle3", "ngram", "suffix"]] and models.trees["sql"] == ("sql", "ngram", "suffix")
    assert models.models_for(prompts, [["tree", "ngram"]]) == {"sql"}  # the tree's draft
    with pytest.raises(ValueError, match="needs a draft"):
        local_models(None, OwnModels(str(tiny_zoo.target_dir), {"mine": "x"}, {"db": ("ngram", "tree")}), None)


def test_validate_command_through_the_service(service, tiny_zoo, tmp_path, capsys):
    """`validate --address` against the real service (the shared cluster): its requests over gRPC,
    the service's choices of task and draft, and its report."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": tiny_zoo.prompts("sql")[0], "task": "sql"}) + "\n"
                       + json.dumps({"prompt": tiny_zoo.prompts("prose")[0]}) + "\n")
    code = main(["validate", "--address", service.address, "--prompts", str(prompts), "--temperatures", "1.0",
                 "--samples", "10", "--max-tokens", "16", "--seed", "0"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    report = json.loads(captured.out)
    rows = [(t["task"], t["draft"]) for t in report["tasks"]]
    # The task a prompt names; the other prompt's task, classified; each with drafts the service
    # allows it (which ones, its policy's choice: it samples).
    assert rows[0][0] == "sql" and all(draft for _, draft in rows), rows
    tasks = {task for task, _ in rows}
    assert tasks <= set(tiny_zoo.manifest["task_drafts"]) and len(tasks) == 2, rows
    assert all(draft in tiny_zoo.manifest["task_drafts"][task] for task, draft in rows), rows
    assert {t["task"] for t in report["sampled"]["tests"]} == tasks, report["sampled"]
    assert report["greedy"]["identical"] and "the service's choice" in captured.err
    assert f"through the service at {service.address}" in captured.err


@pytest.mark.parametrize("content, flags, message", [
    (None, [], "no such file"),
    ("\n  \n", [], "holds no prompts"),
    ('{"prompt": "a"}\n{"prompt": "b"\n', [], "line 2: not valid JSON"),
    ('{"prompt": "a", "taks": "sql"}\n', [], "line 1: unknown keys ['taks']"),
    ('{"prompt": ""}\n', [], '"prompt" must be a non-empty string'),
    ('{"prompt": "a", "task": "poetry"}\n', [], "unknown task 'poetry'"),
    ("SELECT\n", ["--samples", "5"], "--samples must be >= 10"),
    ("SELECT\n", ["--temperatures", "0,1"], "greedy is always checked"),
    ("SELECT\n", ["--draft", "nope"], "--draft 'nope' is not a draft of these models"),
])
def test_bad_input_exits_2_with_one_line(tiny_zoo, tmp_path, capsys, content, flags, message):
    prompts = tmp_path / "prompts.txt"
    if content is not None:
        prompts.write_text(content)
    code = main(["validate", "--zoo", str(tiny_zoo.root), "--prompts", str(prompts), *flags])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and message in err, err


def test_prompts_files_read_as_json_lines_or_plain_text(tmp_path):
    jsonl, text = tmp_path / "a.jsonl", tmp_path / "b.txt"
    jsonl.write_text('{"prompt": "SELECT", "task": "sql"}\n\n{"prompt": "two\\nlines"}\n')
    text.write_text("first prompt\n\n  second one  \n")
    assert read_prompts(jsonl) == [Prompt("SELECT", "sql"), Prompt("two\nlines")]
    assert read_prompts(text) == [Prompt("first prompt"), Prompt("  second one  ")]
