"""`specserve classifier train` and `predict`: the task classifier for requests that name no task."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from .common import DEFAULT_ZOO, add_zoo_argument


def register(commands: argparse._SubParsersAction) -> None:
    classifier = commands.add_parser("classifier", help="the task classifier for requests that name no task").add_subparsers(
        dest="classifier_command", required=True, metavar="ACTION")
    train = classifier.add_parser(
        "train", help="train a task classifier from a zoo's corpora and/or your labelled prompts",
        description="Train the classifier the router resolves task-less requests with (naive Bayes over hashed "
                    "words and character n-grams): on prompt-like slices of the zoo's training documents, plus "
                    "labelled examples, which may teach it new tasks. Prints its accuracy on the zoo's held-out "
                    "prompts. Serve it with router.policy.classifier in the Serve config.")
    train.add_argument("--zoo", help=f"a zoo preset name or a zoo directory (default: {DEFAULT_ZOO}; with "
                                     "--no-corpora, none, and no held-out report)")
    train.add_argument("--labelled", action="extend", nargs="+", default=[], metavar="FILE.jsonl",
                       help='JSONL files, one {"text": ..., "task": ...} object per line (repeatable)')
    train.add_argument("--no-corpora", action="store_true", help="train on the --labelled examples alone")
    train.add_argument("--out", required=True, type=Path, metavar="PATH", help="the .npz file to write")
    train.set_defaults(run=run_train)

    predict = classifier.add_parser("predict", help="print the task of a text and the classifier's confidence",
                                    description="Classify TEXT as the router would a request without a task.")
    add_zoo_argument(predict, "whose classifier to use ")
    predict.add_argument("--classifier", type=Path, metavar="PATH", help="use this .npz instead of the zoo's")
    predict.add_argument("--json", action="store_true", help="print one JSON object with every task's probability")
    predict.add_argument("text", metavar="TEXT", help="the prompt to classify")
    predict.set_defaults(run=run_predict)


def run_train(args: argparse.Namespace) -> int:
    from specserve.workers.classifier import TaskClassifier
    from specserve.cluster.zoo.task_classifier import held_out_examples, read_labelled, train_from_corpora, zoo_corpora

    from ..local import open_zoo

    if args.no_corpora and not args.labelled:
        raise ValueError("--no-corpora needs --labelled FILE.jsonl: there would be nothing to train on")
    if args.out.is_dir() or not args.out.parent.is_dir():
        raise ValueError(f"--out {args.out} must be a file in an existing directory")
    labelled = [example for path in args.labelled for example in read_labelled(path)]
    # The zoo's corpora are trained on unless --no-corpora; its held-out prompts are reported on either way.
    zoo_name = args.zoo or (None if args.no_corpora else DEFAULT_ZOO)
    zoo = open_zoo(zoo_name) if zoo_name else None
    corpora = zoo_corpora(zoo) if zoo else {}
    if args.no_corpora:
        classifier = TaskClassifier.train(labelled)
    else:
        classifier = train_from_corpora(corpora, zoo.manifest["seed"], labelled)
    classifier.save(args.out)
    counts = ", ".join(f"{task} {n}" for task, n in classifier.examples.items())
    print(f"task classifier written to {args.out} (training examples: {counts})")
    held_out = {task: held_out_examples(corpora[task]) for task in classifier.tasks if task in corpora}
    if held_out:
        print(f"{'task':<10} {'held-out':>8} {'accuracy':>8} {'mean confidence':>15}")
    for task, examples in held_out.items():
        predictions = [classifier.predict(text) for text, _ in examples]
        accuracy = sum(p.task == task for p in predictions) / len(predictions)
        confidence = sum(p.confidence for p in predictions) / len(predictions)
        print(f"{task:<10} {len(predictions):>8} {accuracy:>8.3f} {confidence:>15.3f}")
    return 0


def run_predict(args: argparse.Namespace) -> int:
    from ..local import load_task_classifier

    from ..local import open_zoo

    zoo = None if args.classifier else open_zoo(args.zoo)
    classifier = load_task_classifier(args.classifier, zoo)
    if classifier is None:
        raise ValueError(f"zoo {args.zoo!r} has neither a classifier nor corpora to train one from; give --classifier")
    prediction = classifier.predict(args.text)
    if args.json:
        print(json.dumps({"task": prediction.task, "confidence": prediction.confidence,
                          "scores": classifier.scores(args.text)}))
    else:
        print(f"{prediction.task} {prediction.confidence:.3f}")
    return 0
