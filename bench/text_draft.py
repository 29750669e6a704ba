"""Train a draft for any target by its text, in a tokenizer of its own or in the target's: the pair
the real-model bench measures side by side (the same recipe, only the tokenizer differs).

    .venv/bin/specserve text-draft --target PATH/SmolLM2-135M-Instruct.Q4_1.gguf \\
        --corpus FILE... --out DIR --own-vocab 8192          # a draft of another tokenizer
    .venv/bin/specserve text-draft --target ... --corpus FILE... --out DIR2   # the target's

The recipe (cluster/zoo/other_tokenizer.py, ``train_text_draft``): the target's greedy
continuations of prompts cut from the corpus, and the corpus itself, as the draft's training text
(sequence-level distillation: a draft of another vocabulary cannot learn the target's logits).
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

from specserve.cluster.zoo.distill import documents_from_files
from specserve.cluster.zoo.other_tokenizer import FACTS, TextDraft, first_chars, train_text_draft
from specserve.cluster.zoo.presets import ModelShape, TrainBudget
from specserve.workers.loading import ModelSpec, load_model, load_tokenizer

SHAPE = ModelShape(256, 2, 704, 4, tie_embeddings=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="specserve text-draft", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--target", required=True, help="a model directory, hub id or .gguf file")
    parser.add_argument("--corpus", nargs="+", required=True, metavar="FILE", help="UTF-8 text files")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--own-vocab", type=int, metavar="N", help="a byte-level BPE of its own of N tokens "
                                                                  "(default: the target's tokenizer)")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--rollouts", type=int, default=256, help="the target's continuations of as many prompts")
    parser.add_argument("--new-tokens", type=int, default=64, help="tokens in each")
    parser.add_argument("--chars", type=int, default=2_000_000, help="of the corpus, at most")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    started = time.perf_counter()
    documents = first_chars(documents_from_files(args.corpus), args.chars)
    target = load_model(ModelSpec(args.target)).eval()
    recipe = TextDraft(SHAPE, TrainBudget(args.steps, args.batch_size, 1e-3), 2048, args.seq_len, args.own_vocab,
                       args.rollouts, args.new_tokens)
    facts = train_text_draft(target, load_tokenizer(args.target), documents, recipe, args.out)
    facts |= {"target": args.target, "corpus_chars": sum(map(len, documents)), "seconds": round(time.perf_counter() - started, 1)}
    (args.out / FACTS).write_text(json.dumps(facts, indent=2))
    print(json.dumps(facts, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
