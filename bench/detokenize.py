"""What incremental detokenization costs per committed chunk, all in the OutputAssembler (stop
string search and hold-back included) but the last column:

- window re-decode: the assembler as it is (two `tokenizer.decode` calls a token);
- via backend: the same, calling the Rust tokenizer's decode without transformers' wrapper;
- + DecodeStream: the `tokenizers` library's DecodeStream for complete characters, the window
  re-decode only while a character is unfinished (the switch considered in workers/stopping.py);
- DecodeStream alone: its `step` per token and nothing else, a floor for any assembler using it.

Outputs are real text (the zoo's held-out documents) of 128 and 1024 tokens, committed 1, 3 or 5
tokens at a time; the tokenizer is the zoo's, trained here at the tiny and bench vocab sizes. Every
variant's text is checked against `tokenizer.decode`. Prints microseconds per chunk, best of REPEATS.

    .venv/bin/python bench/detokenize.py
"""

from __future__ import annotations

import time
from collections.abc import Callable

from tokenizers.decoders import DecodeStream

from specserve.workers.stopping import OutputAssembler
from specserve.cluster.zoo.corpora import TASKS, build_corpus
from specserve.cluster.zoo.tokenizer import train_tokenizer

REPEATS = 41
MAX_TOKENS = 1 << 20  # never reached: requests here end with their text
STOP = ("\n\n\n",)  # a stop string that real text seldom holds: searched for on every token, never hit


class BackendDecode:
    """Stands in for the tokenizer: decodes straight through its Rust tokenizer."""

    def __init__(self, tokenizer) -> None:
        self.eos_token_id = tokenizer.eos_token_id
        self._decode = tokenizer.backend_tokenizer.decode

    def decode(self, ids: list[int], clean_up_tokenization_spaces: bool) -> str:
        return self._decode(ids, skip_special_tokens=False)


class StreamAssembler(OutputAssembler):
    """The assembler with DecodeStream for complete characters and the window re-decode only while
    a character is unfinished (DecodeStream gives no text then; stop strings and the final text need
    it). A prototype for the zoo's byte-level tokenizer: a byte-fallback one can make DecodeStream
    raise InvalidPrefix, which this does not handle."""

    def __init__(self, tokenizer, max_tokens: int, stop: tuple[str, ...] = ()) -> None:
        super().__init__(tokenizer, max_tokens, stop)
        self._stream = DecodeStream(skip_special_tokens=False)
        self._backend = tokenizer.backend_tokenizer

    def _decode_tail(self) -> str:
        piece = self._stream.step(self._backend, self.token_ids[-1])
        if piece is not None:  # complete: settle it, moving the window as the re-decode would
            self._settled += piece
            self._prefix, self._read = self._read, len(self.token_ids)
            return ""
        return super()._decode_tail()


def variants(tokenizer) -> dict[str, Callable[[list[list[int]]], str]]:
    """Each detokenizes one request's chunks and returns its text."""
    backend = BackendDecode(tokenizer)
    return {
        "window re-decode": lambda chunks: _assemble(OutputAssembler(tokenizer, MAX_TOKENS, STOP), chunks),
        "via backend": lambda chunks: _assemble(OutputAssembler(backend, MAX_TOKENS, STOP), chunks),
        "+ DecodeStream": lambda chunks: _assemble(StreamAssembler(tokenizer, MAX_TOKENS, STOP), chunks),
        "DecodeStream alone": lambda chunks: _stream_alone(tokenizer, chunks),
    }


def main() -> None:
    corpora = {task: build_corpus(task, 0, 120_000) for task in TASKS}
    train = [doc for corpus in corpora.values() for doc in corpus.train]
    text = "\n\n".join(doc for corpus in corpora.values() for doc in corpus.held_out)
    tokenizers = {vocab_size: train_tokenizer(train, vocab_size) for vocab_size in (384, 4096)}
    print("vocab tokens per chunk", *variants(tokenizers[384]), "(us per chunk)")
    for vocab_size, tokenizer in tokenizers.items():
        ids = [t for t in tokenizer.encode(text) if t != tokenizer.eos_token_id]
        for length in (128, 1024):
            expected = tokenizer.decode(ids[:length], clean_up_tokenization_spaces=False)
            for size in (1, 3, 5):
                chunks = [ids[i : min(i + size, length)] for i in range(0, length, size)]
                row = []
                for name, request in variants(tokenizer).items():
                    assert request(chunks) == expected, name
                    row.append(f"{_per_chunk(lambda: request(chunks), len(chunks)):>{len(name)}.1f}")
                print(f"{vocab_size:>5} {length:>6} {size:>9}", *row)


def _assemble(out: OutputAssembler, chunks: list[list[int]]) -> str:
    return "".join(out.add(chunk).text for chunk in chunks)


def _stream_alone(tokenizer, chunks: list[list[int]]) -> str:
    stream, backend = DecodeStream(skip_special_tokens=False), tokenizer.backend_tokenizer
    return "".join(stream.step(backend, token) or "" for chunk in chunks for token in chunk)


def _per_chunk(request: Callable[[], str], chunks: int) -> float:
    """Microseconds per chunk, best of REPEATS requests (the least disturbed by other processes)."""
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        request()
        times.append(time.perf_counter() - start)
    return min(times) / chunks * 1e6


if __name__ == "__main__":
    main()
