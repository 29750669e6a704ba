"""Which task a prompt belongs to, for requests that name none: multinomial naive Bayes over hashed text features.

Glossary
- feature: a lowercased word of the prompt, or a character 3- or 4-gram of it as written (case and
  indentation are evidence: upper-case SQL keywords, four-space Python blocks), hashed with a stable
  hash (never Python's per-process salted ``hash()``) into one of ``buckets`` buckets.
- likelihood: per task, a smoothed distribution over buckets, ``(1 - smoothing) * count / total +
  smoothing / buckets`` (Jelinek-Mercer). A bucket no task has seen gets the same probability under
  every task, so text unlike all of them is no evidence for any; with add-one (Laplace) smoothing it
  would be evidence for the task with the smallest corpus.
- confidence: the posterior probability of the top task, from ``temperature * sum of log-likelihoods
  / (number of features + PRIOR_FEATURES)``. Naive Bayes sums one log-likelihood per feature as if
  features were independent, but every character sits in several overlapping n-grams and a word, so
  the plain sum counts the same evidence many times and its posterior is 1.0 for any prompt of a few
  lines. Divided by the number of features, the score no longer grows with length; ``temperature``
  then scales it so that posteriors match how often the top task is right: it is fitted at training
  time, minimising log loss on predictions for examples each made by a model that did not see them
  (two folds). PRIOR_FEATURES phantom features, favouring no task, keep a prompt of a few characters
  from looking certain (on the demo zoo, "hello" was prose at 0.91 without them, 0.68 with them).
  Features no task has seen favour none either, so text unlike every task gets low confidence.
- prior: uniform. How much text each corpus has says nothing about the mix of requests.

Only the last ``max_chars`` characters are read: the continuation follows the end of the prompt,
and it bounds the cost per request (about 0.1 ms for 500 characters on the 2-core development machine).

Files are ``.npz`` written by numpy and read without unpickling: the parameters as one float array
and everything else (format version, task names, feature settings) as a JSON string inside.
"""

from __future__ import annotations

import json
import math
import os
import re
import zipfile
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

# Bump whenever a file written before would be read differently, including any change to how
# features are hashed or to PRIOR_FEATURES: a classifier is only meaningful with the hashing and
# the scoring its temperature was fitted with.
FORMAT = 1
# Measured on the demo and tiny zoos: cross-validated log loss is within 0.5% for 0-30, so this
# costs in-task prompts nothing, while 5-character prompts stop scoring 0.9.
PRIOR_FEATURES = 20
# Jelinek-Mercer weight of the uniform distribution (on the demo zoo, 0.02-0.5 are within 0.5% accuracy).
SMOOTHING = 0.2
TEMPERATURES = np.geomspace(0.5, 500.0, 141)  # candidate temperatures, 5% apart
CALIBRATION_FOLDS = 2
_WORD = re.compile(r"\w+")
# 64-bit FNV-1a over code points, then a murmur-style finaliser: low bits pick the bucket and FNV's
# low bits mix poorly on their own.
_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)
_MIX = np.uint64(0xFF51AFD7ED558CCD)


class ClassifierFileError(ValueError):
    """A file that is not a task classifier this version can read."""


@dataclass(frozen=True)
class FeatureParams:
    # 4 tasks x 2^18 float32 = 4 MB (0.6 MB on disk). Code alone fills half the buckets on the demo zoo,
    # and odd text hashing into them reads a little as code: 2^20 buckets took random unicode from 0.48
    # to 0.39 confidence (and accuracy +0.3%), at four times the memory.
    buckets: int = 2**18
    ngrams: tuple[int, ...] = (3, 4)  # character n-gram lengths
    max_chars: int = 1024  # of the end of the prompt

    def __post_init__(self) -> None:
        if self.buckets < 1 or not self.ngrams or min(self.ngrams) < 1 or self.max_chars < 1:
            raise ValueError(f"feature parameters must be positive, got {self}")


@dataclass(frozen=True)
class Prediction:
    task: str
    confidence: float  # posterior probability of `task`, in [1 / number of tasks, 1]


def features(text: str, params: FeatureParams) -> np.ndarray:
    """The bucket of every feature of ``text``, with repeats: ``[num_features]`` intp."""
    text = text[-params.max_chars:]
    words = [zlib.crc32(word.encode("utf-8", "surrogatepass")) for word in _WORD.findall(text.lower())]
    codes = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype="<u4").astype(np.uint64)  # [chars]
    hashes = [np.array(words, dtype=np.uint64)]
    for n in params.ngrams:
        if len(codes) >= n:
            hashes.append(_ngram_hashes(codes, n))
    return (np.concatenate(hashes) % np.uint64(params.buckets)).astype(np.intp)


def _ngram_hashes(codes: np.ndarray, n: int) -> np.ndarray:
    """FNV-1a of every n consecutive code points, seeded by n so 3- and 4-grams differ: ``[chars - n + 1]``."""
    h = np.full(len(codes) - n + 1, _FNV_OFFSET ^ np.uint64(n), dtype=np.uint64)
    for i in range(n):
        h = (h ^ codes[i:len(codes) - n + 1 + i]) * _FNV_PRIME  # uint64 arithmetic wraps, as FNV wants
    h ^= h >> np.uint64(33)
    h *= _MIX
    return h ^ (h >> np.uint64(33))


class TaskClassifier:
    """Naive Bayes over hashed features, with a fitted temperature (see the module docstring)."""

    def __init__(self, tasks: Sequence[str], log_probs: np.ndarray, temperature: float, params: FeatureParams, *,
                 examples: dict[str, int] | None = None):
        log_probs = np.ascontiguousarray(log_probs, dtype=np.float32)
        if log_probs.shape != (len(tasks), params.buckets) or len(set(tasks)) != len(tasks) or not tasks:
            raise ValueError(f"log_probs must be [tasks={len(tasks)}, buckets={params.buckets}] over distinct "
                             f"tasks, got {log_probs.shape} for {list(tasks)}")
        if not (math.isfinite(temperature) and temperature > 0):
            raise ValueError(f"temperature must be a finite number > 0, got {temperature}")
        self.tasks = tuple(tasks)
        self.params = params
        self.temperature = float(temperature)
        self.examples = dict(examples or {})  # training examples per task, for the record
        self._log_probs = log_probs  # [tasks, buckets]

    @classmethod
    def train(cls, examples: Iterable[tuple[str, str]], params: FeatureParams = FeatureParams(),
              smoothing: float = SMOOTHING) -> TaskClassifier:
        """Fit on (text, task) pairs; tasks keep the order they first appear in. Deterministic."""
        if not 0.0 < smoothing <= 1.0:
            raise ValueError(f"smoothing must be in (0, 1], got {smoothing}")
        texts, labels = _unzip(examples)
        tasks = list(dict.fromkeys(labels))
        if len(tasks) < 2:
            raise ValueError(f"a task classifier needs examples of at least two tasks, got {tasks or 'none'}")
        y = np.array([tasks.index(label) for label in labels])  # [examples]
        feats = [features(text, params) for text in texts]
        # The fold of an example is a hash of its text: stable, and duplicates share a fold.
        fold = np.array([zlib.crc32(text.encode("utf-8", "surrogatepass")) % CALIBRATION_FOLDS for text in texts])
        evidence, truth = [], []  # out-of-fold predictions
        for k in range(CALIBRATION_FOLDS):
            fit = fold != k
            log_probs = _log_probs(feats, y, fit, len(tasks), params.buckets, smoothing)
            evidence += [_evidence(log_probs, feats[i]) for i in np.flatnonzero(~fit)]
            truth += list(y[~fit])
        temperature = _fit_temperature(np.array(evidence), np.array(truth))
        everything = np.ones(len(texts), dtype=bool)
        return cls(tasks, _log_probs(feats, y, everything, len(tasks), params.buckets, smoothing), temperature,
                   params, examples={task: int((y == i).sum()) for i, task in enumerate(tasks)})

    def scores(self, text: str) -> dict[str, float]:
        """Posterior probability of every task."""
        return dict(zip(self.tasks, self._posterior(text).tolist(), strict=True))

    def predict(self, text: str) -> Prediction:
        posterior = self._posterior(text)
        best = int(posterior.argmax())
        return Prediction(self.tasks[best], float(posterior[best]))

    def _posterior(self, text: str) -> np.ndarray:
        return _softmax(self.temperature * _evidence(self._log_probs, features(text, self.params)))

    def save(self, path: str | os.PathLike) -> None:
        """Write a self-describing ``.npz`` atomically (a reader never sees half a file)."""
        path = Path(path)
        meta = {"format": FORMAT, "tasks": list(self.tasks), "features": asdict(self.params),
                "temperature": self.temperature, "examples": self.examples}
        tmp = path.with_name(path.name + ".partial")
        with open(tmp, "wb") as f:  # a file object: np.savez would append ".npz" to a path
            np.savez_compressed(f, log_probs=self._log_probs, meta=np.array(json.dumps(meta)))
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: str | os.PathLike) -> TaskClassifier:
        """Read a file written by ``save``; never unpickles, refuses other formats with a clear message."""
        what = f"{path} is not a task classifier (a .npz written by `specserve classifier train`)"
        try:
            loaded = np.load(path, allow_pickle=False)
        except (ValueError, EOFError, zipfile.BadZipFile):  # numpy says ValueError for anything else, pickles too
            raise ClassifierFileError(f"{what}: it is not an .npz archive (pickled files are refused)") from None
        if not isinstance(loaded, np.lib.npyio.NpzFile):  # a bare .npy array
            raise ClassifierFileError(what)
        with loaded:
            try:
                meta = json.loads(str(loaded["meta"][()]))
                log_probs = loaded["log_probs"]
            except (KeyError, ValueError):  # missing, an object array numpy will not unpickle, or not JSON
                raise ClassifierFileError(what) from None
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            found = meta.get("format") if isinstance(meta, dict) else None
            raise ClassifierFileError(f"{path} is a task classifier of format {found}; this version of specserve "
                                      f"reads format {FORMAT}: retrain it with `specserve classifier train`")
        try:
            params = FeatureParams(**{**meta["features"], "ngrams": tuple(meta["features"]["ngrams"])})
            return cls(meta["tasks"], log_probs, meta["temperature"], params, examples=meta["examples"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ClassifierFileError(f"{path} is a damaged task classifier ({exc}): retrain it") from None


def _unzip(examples: Iterable[tuple[str, str]]) -> tuple[list[str], list[str]]:
    texts, labels = [], []
    for i, pair in enumerate(examples):
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2 and all(isinstance(x, str) for x in pair)
                and pair[1]):
            raise ValueError(f"example {i} must be a (text, task) pair of strings with a task name, got {pair!r:.80}")
        texts.append(pair[0])
        labels.append(pair[1])
    return texts, labels


def _log_probs(feats: list[np.ndarray], y: np.ndarray, use: np.ndarray, num_tasks: int, buckets: int,
               smoothing: float) -> np.ndarray:
    """Smoothed log P(bucket | task) from the examples selected by ``use``: ``[tasks, buckets]``.

    A task without features among them (a fold of very few examples) gets the uniform distribution:
    no evidence for or against it.
    """
    rows = []
    for task in range(num_tasks):
        chosen = [feats[i] for i in np.flatnonzero(use & (y == task))]
        counts = np.bincount(np.concatenate(chosen), minlength=buckets) if chosen else np.zeros(buckets)
        total = counts.sum()
        if not total:
            rows.append(np.full(buckets, 1 / buckets))
            continue
        rows.append((1 - smoothing) * counts / total + smoothing / buckets)
    return np.log(np.stack(rows)).astype(np.float32)


def _evidence(log_probs: np.ndarray, buckets: np.ndarray) -> np.ndarray:
    """Sum of log P(feature | task) over the features, divided by their number plus PRIOR_FEATURES: ``[tasks]``.

    The phantom features favour no task, and only differences between tasks reach the softmax, so
    they need no value of their own.
    """
    # np.take along a task's contiguous row: 5x faster than fancy indexing (measured: ~9 us for 1,000 features).
    return np.take(log_probs, buckets, axis=1).sum(axis=1, dtype=np.float64) / (len(buckets) + PRIOR_FEATURES)


def _softmax(scores: np.ndarray) -> np.ndarray:
    z = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return z / z.sum(axis=-1, keepdims=True)


def _fit_temperature(evidence: np.ndarray, truth: np.ndarray) -> float:
    """The candidate temperature with the least log loss on out-of-fold predictions (ties: the lowest).

    evidence: ``[examples, tasks]`` from ``_evidence``; truth: ``[examples]`` task indices.
    """
    rows = np.arange(len(truth))
    losses = [-np.log(_softmax(t * evidence)[rows, truth] + 1e-12).mean() for t in TEMPERATURES]
    return float(TEMPERATURES[int(np.argmin(losses))])
