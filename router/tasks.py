"""Which task a request is: the one it names, else the classifier's answer when it is confident."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class Classifier(Protocol):
    def predict(self, text: str): ...  # -> an object with .task and .confidence


@dataclass(frozen=True)
class ResolvedTask:
    task: str
    source: str  # request (named by the client), classifier, or default (no classifier, or it was unsure)
    confidence: float  # 1 when named by the client


@dataclass(frozen=True)
class TaskResolver:
    tasks: frozenset[str]  # the deployment's tasks
    default_task: str
    classifier: Classifier | None
    min_confidence: float

    def resolve(self, named: str | None, prompt: str) -> ResolvedTask:
        if named:
            return ResolvedTask(named, "request", 1.0)
        if self.classifier is None:
            return ResolvedTask(self.default_task, "default", 0.0)
        guess = self.classifier.predict(prompt)
        # A task the deployment does not serve (a classifier trained on more tasks) counts as unsure.
        if guess.confidence >= self.min_confidence and guess.task in self.tasks:
            return ResolvedTask(guess.task, "classifier", guess.confidence)
        return ResolvedTask(self.default_task, "default", guess.confidence)
