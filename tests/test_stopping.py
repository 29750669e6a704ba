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
