"""The model zoo and training: building the built-in zoo (a tokenizer, a target, task drafts, an
EAGLE-3 head and a task classifier, trained here on generated corpora), distilling drafts and heads
from your own target (``specserve distill``), and reading a built zoo.

A layer of its own: it imports proto and workers only, and no serving process imports it beyond
reading a zoo's files (tests/test_layering.py). It sits in cluster/ because the repository's top
level keeps the design card's folders.
"""
