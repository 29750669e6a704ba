"""Incremental detokenization equals decoding everything at once, multi-byte characters included."""

import random

from specserve.workers.stopping import OutputAssembler


def test_incremental_text_equals_whole_decode(tiny_zoo):
    from specserve.workers.loading import load_tokenizer

    tokenizer = load_tokenizer(str(tiny_zoo.root / "tokenizer"))
    texts = ["déjà vu — naïve café ☕ 日本語 🙂 def f(x):\n    return x ** 2", "SELECT * FROM t WHERE a = 'ü';"]
    rng = random.Random(0)
    for text in texts:
        ids = tokenizer.encode(text)
        ids += [rng.randrange(3, tokenizer.vocab_size) for _ in range(200)]  # arbitrary, often partial bytes
        out = OutputAssembler(tokenizer, max_tokens=len(ids) + 1)
        streamed = ""
        i = 0
        while i < len(ids):
            step = rng.randint(1, 5)
            streamed += out.add([t for t in ids[i : i + step] if t != tokenizer.eos_token_id]).text
            i += step
        whole = tokenizer.decode([t for t in ids if t != tokenizer.eos_token_id], clean_up_tokenization_spaces=False)
        assert out.text == whole
        assert whole.startswith(streamed.rstrip("\ufffd"))


def test_chunks_add_up_to_the_whole_decode(tiny_zoo):
    """Special tokens, runs of spaces, characters split across tokens, text held back for a stop
    string: whatever the step size, a finished request's chunks join into exactly the decode of its
    tokens (up to the stop string), also when max_tokens cuts a character in two."""
    from specserve.workers.loading import load_tokenizer

    tokenizer = load_tokenizer(str(tiny_zoo.root / "tokenizer"))
    decode = lambda ids: tokenizer.decode(ids, clean_up_tokenization_spaces=False)  # noqa: E731
    special = [tokenizer.bos_token_id, tokenizer.pad_token_id]
    ids = tokenizer.encode("  two  spaces ") + special + tokenizer.encode("日本語 🙂")
    assert decode(ids[:-2]).endswith("\ufffd")  # the cut below falls inside "🙂"
    to_stop = next(n for n in range(len(ids)) if "本" in decode(ids[:n]))
    assert decode(ids[: to_stop - 1]).endswith("\ufffd")  # "本" spans tokens
    cases = [  # max_tokens, stop strings, finish reason, tokens committed, text
        (len(ids) + 1, ("🙂!",), "eos", ids, decode(ids)),  # "🙂" held back until the end
        (len(ids) - 2, ("🙂!",), "length", ids[:-2], decode(ids[:-2])),
        (len(ids) + 1, ("本",), "stop", ids[:to_stop], decode(ids[:to_stop]).removesuffix("本")),
    ]
    for step in (1, 2, 3, 5):
        for max_tokens, stop, reason, expected_ids, expected_text in cases:
            out = OutputAssembler(tokenizer, max_tokens=max_tokens, stop=stop)
            streamed, committed = "", []
            for i in range(0, len(ids) + 1, step):
                chunk = out.add((ids + [tokenizer.eos_token_id])[i : i + step])
                streamed, committed = streamed + chunk.text, committed + chunk.token_ids
                if chunk.finish_reason:
                    break
            assert (chunk.finish_reason, committed) == (reason, expected_ids)
            assert streamed == out.text == expected_text
