"""The task classifier: learns tasks, is calibrated-ish, saves without pickles, ships with every zoo,
retrains from labelled prompts, and answers from the command line."""

import json
import logging
import pickle
import random
import shutil
import statistics
from pathlib import Path

import numpy as np
import pytest

from specserve.cluster.cli import main
from specserve.workers.classifier import FORMAT, ClassifierFileError, FeatureParams, TaskClassifier, features
from specserve.cluster.zoo.build import build_zoo
from specserve.cluster.zoo.presets import get_preset
from specserve.cluster.zoo.task_classifier import (
    corpus_examples, read_labelled, train_from_corpora, zoo_corpora,
)
from specserve.cluster.local import load_task_classifier
from specserve.cluster.zoo.zoo import CLASSIFIER, Zoo

# Measured on the tiny zoo's held-out prompts: code 13/15, sql, math and prose all right (53/55).
MIN_TASK_ACCURACY = 0.7
MIN_ACCURACY = 0.9
# Measured on the tiny zoo: held-out prompts score 0.96 on average (code 0.82); random unicode 0.41,
# shuffled prompts 0.58.
MIN_IN_TASK_CONFIDENCE = 0.85
MAX_ODD_CONFIDENCE = 0.7
SHELL = [  # a task no zoo has, taught by labelled lines
    "$ ls -la /var/log", "$ grep -rn TODO src/", "$ tail -f /var/log/syslog", "$ chmod +x deploy.sh && ./deploy.sh",
    "$ du -sh ~/Downloads", "$ ps aux | grep python", "$ tar -xzf backup.tar.gz -C /tmp", "$ kill -9 4242",
]
SHELL_PROBE = "$ ls -la /etc && grep -rn ssh /etc/ssh"


def synthetic(n: int, seed: int) -> list[tuple[str, str]]:
    """Three made-up tasks with their own vocabularies."""
    rng = random.Random(seed)
    make = {
        "weather": lambda: f"Tomorrow will be {rng.choice(['sunny', 'rainy', 'windy', 'cloudy'])} with "
                           f"{rng.randint(0, 30)} degrees in {rng.choice(['Oslo', 'Lima', 'Perth', 'Quito'])}.",
        "recipe": lambda: f"Mix {rng.randint(1, 5)} cups of {rng.choice(['flour', 'sugar', 'milk', 'rice'])} "
                          f"and bake for {rng.randint(10, 60)} minutes.",
        "shell": lambda: f"$ {rng.choice(['ls -la', 'grep -r x', 'cat', 'tail -f'])} "
                         f"/{rng.choice(['var', 'etc', 'home'])}/{rng.choice(['log', 'conf', 'user'])}",
    }
    return [(make[task](), task) for _ in range(n) for task in make]


@pytest.fixture(scope="module")
def small() -> TaskClassifier:
    return TaskClassifier.train(synthetic(40, seed=0))


@pytest.fixture(scope="module")
def zoo_classifier(tiny_zoo) -> TaskClassifier:
    return TaskClassifier.load(tiny_zoo.classifier_path)


# ----------------------------------------------------------------------------- the classifier alone


def test_learns_synthetic_tasks(small):
    test = synthetic(30, seed=1)
    predictions = [small.predict(text) for text, _ in test]
    assert all(p.task == task for p, (_, task) in zip(predictions, test))
    assert statistics.mean(p.confidence for p in predictions) > 0.9
    assert small.tasks == ("weather", "recipe", "shell")  # in order of first appearance
    scores = small.scores(test[0][0])
    assert set(scores) == set(small.tasks) and sum(scores.values()) == pytest.approx(1.0)


def test_features_are_stable_across_processes():
    """Pinned values: a file trained in one process must mean the same in another (never the salted hash()).
    If the hashing changes on purpose, bump FORMAT and update these."""
    assert features("SELECT id", FeatureParams(buckets=1000, ngrams=(3,))).tolist() == [8, 256, 45, 935, 807, 92,
                                                                                          896, 388, 848]
    assert FORMAT == 1


def test_only_the_end_of_a_long_prompt_is_read():
    params = FeatureParams(max_chars=100)
    tail = "y" * 100
    assert np.array_equal(features("x" * 5000 + tail, params), features(tail, params))


def test_text_without_features_gets_the_prior(small):
    assert small.predict("").confidence == pytest.approx(1 / 3)


def test_text_no_task_has_seen_is_no_evidence():
    """Jelinek-Mercer smoothing: a bucket no task saw has one probability under every task."""
    params = FeatureParams(buckets=2**20)  # sparse enough that the probe's features all land in empty buckets
    classifier = TaskClassifier.train(synthetic(10, seed=0), params)
    probe = "ᚠᚢᚦᚨᚱᚲ"  # runes: no feature in common with the synthetic tasks
    assert classifier.scores(probe) == pytest.approx({task: 1 / 3 for task in classifier.tasks}, abs=1e-9)


def test_a_short_prompt_is_less_certain_than_a_long_one(small):
    short = "Mix 2 cups"
    long = "Mix 2 cups of flour and bake for 30 minutes. Mix 1 cups of milk and bake for 12 minutes."
    assert small.predict(short).task == small.predict(long).task == "recipe"
    assert small.predict(short).confidence < small.predict(long).confidence


def test_train_refuses_a_single_task():
    with pytest.raises(ValueError, match="at least two tasks"):
        TaskClassifier.train([("a", "x"), ("b", "x")])


def test_save_and_load_give_the_same_predictions(small, tmp_path):
    path = tmp_path / "c.npz"
    small.save(path)
    loaded = TaskClassifier.load(path)
    assert (loaded.tasks, loaded.params, loaded.temperature, loaded.examples) == \
        (small.tasks, small.params, small.temperature, small.examples)
    for text, _ in synthetic(5, seed=2) + [("something else entirely", "")]:
        assert loaded.scores(text) == small.scores(text)
    assert not list(tmp_path.glob("*.partial"))


class _Touch:
    """Unpickling this creates a file: proof that a loader unpickled."""

    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self):
        return Path.touch, (self.path,)


def test_load_never_unpickles(tmp_path):
    marker = tmp_path / "unpickled"
    pickled = tmp_path / "classifier.pkl"
    pickled.write_bytes(pickle.dumps(_Touch(marker)))
    with pytest.raises(ClassifierFileError, match="not an .npz archive"):
        TaskClassifier.load(pickled)
    hidden = tmp_path / "object-array.npz"  # an archive whose parameters are a pickled object array
    meta = {"format": FORMAT, "tasks": ["a", "b"], "features": {"buckets": 1, "ngrams": [3], "max_chars": 1},
            "temperature": 1.0, "examples": {}}
    np.savez(hidden, log_probs=np.array([_Touch(marker)], dtype=object), meta=np.array(json.dumps(meta)))
    with pytest.raises(ClassifierFileError, match="is not a task classifier"):
        TaskClassifier.load(hidden)
    assert not marker.exists()


def test_load_refuses_another_format_version(small, tmp_path):
    path = tmp_path / "c.npz"
    small.save(path)
    with np.load(path) as saved:
        meta, log_probs = json.loads(str(saved["meta"][()])), saved["log_probs"]
    future = tmp_path / "future.npz"
    np.savez(future, log_probs=log_probs, meta=np.array(json.dumps({**meta, "format": FORMAT + 1})))
    with pytest.raises(ClassifierFileError, match=f"of format {FORMAT + 1}; this version of specserve reads format "
                                                  f"{FORMAT}: retrain it with `specserve classifier train`"):
        TaskClassifier.load(future)


@pytest.mark.parametrize("content", [b"", b"not an archive", b"PK\x03\x04 broken zip"])
def test_load_refuses_other_files(tmp_path, content):
    path = tmp_path / "c.npz"
    path.write_bytes(content)
    with pytest.raises(ClassifierFileError, match="is not a task classifier"):
        TaskClassifier.load(path)


def test_predict_does_bounded_work_whatever_the_prompt(zoo_classifier):
    """It runs on the router's event loop, so its work must not grow with the prompt: it reads the
    prompt's last ``max_chars`` characters only (about 0.1 ms a prompt measured on the 2-core
    development machine; a time is not judged here, on a machine that may be busy)."""
    params = zoo_classifier.params
    long = "SELECT name FROM users WHERE id = 1; " * 100_000
    tail = long[-params.max_chars:]
    assert np.array_equal(features(long, params), features(tail, params))
    assert len(features(long, params)) <= (1 + len(params.ngrams)) * params.max_chars
    assert zoo_classifier.predict(long) == zoo_classifier.predict(tail)


# ----------------------------------------------------------------------------- with the tiny zoo


def test_held_out_prompts_are_classified(zoo_classifier, tiny_zoo):
    right = {task: [zoo_classifier.predict(p).task == task for p in tiny_zoo.prompts(task)] for task in tiny_zoo.tasks}
    assert all(statistics.mean(r) >= MIN_TASK_ACCURACY for r in right.values()), right
    assert statistics.mean(x for r in right.values() for x in r) >= MIN_ACCURACY


def test_odd_text_gets_lower_confidence_than_prompts(zoo_classifier, tiny_zoo):
    rng = random.Random(0)
    prompts = [p for task in tiny_zoo.tasks for p in tiny_zoo.prompts(task)]
    in_task = statistics.mean(zoo_classifier.predict(p).confidence for p in prompts)
    odd = {
        "random unicode": ["".join(chr(rng.randint(0x20, 0x2FFF)) for _ in range(200)) for _ in range(30)],
        "shuffled prompts": ["".join(rng.sample(p, len(p))) for p in prompts[:30]],
    }
    assert in_task >= MIN_IN_TASK_CONFIDENCE
    for name, texts in odd.items():
        assert statistics.mean(zoo_classifier.predict(t).confidence for t in texts) <= MAX_ODD_CONFIDENCE, name


def test_trains_on_training_documents_only(tiny_zoo):
    corpus = tiny_zoo.corpus("code")
    train_text = "\n".join(corpus.train)
    examples = corpus_examples(corpus, seed=0)
    assert {task for _, task in examples} == {"code"} and len(examples) > len(corpus.train)
    assert all(text in train_text for text, _ in examples)


def test_labelled_lines_teach_a_new_task(tiny_zoo, zoo_classifier, tmp_path):
    path = tmp_path / "shell.jsonl"
    path.write_text("\n".join(json.dumps({"text": t, "task": "shell"}) for t in SHELL) + "\n\n")
    assert zoo_classifier.predict(SHELL_PROBE).task != "shell"
    retrained = train_from_corpora(zoo_corpora(tiny_zoo), tiny_zoo.manifest["seed"], read_labelled(path))
    assert retrained.tasks == (*tiny_zoo.tasks, "shell")
    assert retrained.predict(SHELL_PROBE).task == "shell"
    assert all(retrained.predict(p).task == "sql" for p in tiny_zoo.prompts("sql"))  # the rest still holds


@pytest.mark.parametrize("lines, message", [
    (['{"text": "a", "task": "x"}', "{nope"], ":2: not JSON (Expecting property name"),
    (['["a", "x"]'], ':1: expected an object with string fields "text" and "task"'),
    (['{"text": "a"}'], ':1: expected an object with string fields "text" and "task"'),
    (['{"text": " ", "task": "x"}'], ":1: text is empty"),
    (['', '{"text": "a", "task": "two words"}'], ":2: task must be 1-64 letters, digits"),
    (["", "  "], "has no examples"),
])
def test_labelled_files_are_checked_line_by_line(tmp_path, lines, message):
    path = tmp_path / "l.jsonl"
    path.write_text("\n".join(lines))
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("[", r"\[")):
        read_labelled(path)


# ----------------------------------------------------------------------------- zoo stage and loader


def test_every_zoo_gets_a_classifier_and_old_zoos_are_upgraded(tiny_zoo, zoo_classifier, tmp_path):
    old = tmp_path / "zoo"
    shutil.copytree(tiny_zoo.root, old, ignore=shutil.ignore_patterns(CLASSIFIER))
    manifest_mtime = (old / "manifest.json").stat().st_mtime_ns
    zoo = build_zoo(get_preset("tiny"), old)
    assert zoo.classifier_path == old / CLASSIFIER and zoo.classifier_path.exists()
    assert (old / "manifest.json").stat().st_mtime_ns == manifest_mtime  # nothing else was rebuilt
    rebuilt = TaskClassifier.load(zoo.classifier_path)  # the build is deterministic
    for prompt in tiny_zoo.prompts("prose"):
        assert rebuilt.scores(prompt) == zoo_classifier.scores(prompt)


def test_loader_prefers_a_path_then_the_zoo_then_trains(tiny_zoo, zoo_classifier, small, tmp_path, caplog):
    path = tmp_path / "mine.npz"
    small.save(path)
    assert load_task_classifier(path, tiny_zoo).tasks == small.tasks
    assert load_task_classifier(None, tiny_zoo).tasks == zoo_classifier.tasks
    assert load_task_classifier(None, None) is None

    old = tmp_path / "old-zoo"
    shutil.copytree(tiny_zoo.root, old, ignore=shutil.ignore_patterns(CLASSIFIER, "distill", "drafts", "target"))
    with caplog.at_level(logging.WARNING, logger="specserve.zoo"):
        trained = load_task_classifier(None, Zoo.open(old))
    assert "has no classifier.npz" in caplog.text and "training the task classifier from its corpora" in caplog.text
    assert trained.scores(SHELL_PROBE) == zoo_classifier.scores(SHELL_PROBE)  # as the build stage trains it
    assert not (old / CLASSIFIER).exists()  # a router does not write into the zoo

    shutil.rmtree(old / "corpora")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="specserve.zoo"):
        assert load_task_classifier(None, Zoo.open(old)) is None
    assert "has no corpora" in caplog.text and "default task" in caplog.text


# ----------------------------------------------------------------------------- command line


def test_cli_trains_with_labelled_lines_and_predicts(tiny_zoo, tmp_path, capsys):
    labelled = tmp_path / "shell.jsonl"
    labelled.write_text("\n".join(json.dumps({"text": t, "task": "shell"}) for t in SHELL))
    out = tmp_path / "c.npz"
    code = main(["classifier", "train", "--zoo", str(tiny_zoo.root), "--labelled", str(labelled), "--out", str(out)])
    assert code == 0
    report = capsys.readouterr().out
    assert f"written to {out}" in report and "shell 8" in report
    rows = {line.split()[0]: line.split()[1:] for line in report.splitlines()[2:]}
    assert set(rows) == set(tiny_zoo.tasks) and float(rows["sql"][1]) >= MIN_TASK_ACCURACY  # held-out n, accuracy, conf

    assert main(["classifier", "predict", "--classifier", str(out), SHELL_PROBE]) == 0
    task, confidence = capsys.readouterr().out.split()
    assert task == "shell" and 0.5 < float(confidence) <= 1.0

    assert main(["classifier", "predict", "--zoo", str(tiny_zoo.root), "--json", tiny_zoo.prompts("math")[0]]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["task"] == "math" and answer["confidence"] == max(answer["scores"].values())


def test_cli_trains_on_labelled_lines_alone(tmp_path, capsys):
    labelled = tmp_path / "l.jsonl"
    labelled.write_text("\n".join(json.dumps({"text": t, "task": task}) for t, task in synthetic(10, seed=0)))
    out = tmp_path / "c.npz"
    assert main(["classifier", "train", "--no-corpora", "--labelled", str(labelled), "--out", str(out)]) == 0
    assert "held-out" not in capsys.readouterr().out  # no zoo: nothing to report on
    assert TaskClassifier.load(out).tasks == ("weather", "recipe", "shell")


@pytest.mark.parametrize("args, message", [
    (["train", "--no-corpora", "--out", "{tmp}/c.npz"], "--no-corpora needs --labelled FILE.jsonl"),
    (["train", "--no-corpora", "--labelled", "{tmp}/bad.jsonl", "--out", "{tmp}/c.npz"], "bad.jsonl:2: not JSON"),
    (["train", "--no-corpora", "--labelled", "{tmp}/none.jsonl", "--out", "{tmp}/c.npz"], "No such file"),
    (["train", "--no-corpora", "--labelled", "{tmp}/bad.jsonl", "--out", "{tmp}/no/c.npz"], "in an existing directory"),
    (["predict", "--classifier", "{tmp}/bad.jsonl", "x"], "is not a task classifier"),
])
def test_cli_errors_are_one_line(tmp_path, capsys, args, message):
    (tmp_path / "bad.jsonl").write_text('{"text": "a", "task": "x"}\n{"text": ')
    code = main(["classifier", *[a.format(tmp=tmp_path) for a in args]])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and message in err and err.startswith("specserve: error: ")
