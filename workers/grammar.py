"""Structured output: a grammar (a JSON schema, a regular expression, a Lark grammar) over the output.

The grammar masks the target: each verify row's logits keep only the tokens the grammar allows
after the output that row sees (the committed tokens, then the proposal's tokens before it; a token
tree's rows along their paths), and the acceptance rule runs on the masked rows, so the output is
the constrained target's (its p masked and renormalised) with every proposer. A draft model drafts
within the grammar too (workers/drafting.py: its q masked alike, so it proposes nothing the target
must reject). Other proposals (a head's, prompt lookup's) are not masked: the rule needs only the q
they really sampled from, and a proposed token the grammar forbids has p = 0 there, so it is
rejected (greedy: the row's argmax differs; sampled: accepted with probability 0, the next token
drawn from the residual). The proposal is cut just after that token: the rows beyond it would never
be read.

Built on llguidance (Microsoft's, the Rust engine behind Guidance; vLLM and SGLang ship it as a
backend): one self-contained wheel with no torch or CUDA dependency (xgrammar pulls Triton), masks
computed lazily per step in tens of microseconds, a matcher that checks tokens without consuming them
and rolls back, which is what checking a k-token proposal needs; docs/pages/api.md has the numbers.

A grammar is compiled once per source at the edge (``compile_grammar``, workers/grammar_spec.py: the
router checks it and answers a bad one with a message that says what to fix) and once per replica
into a matcher that sessions copy (``GrammarCompiler``, an LRU of pristine matchers).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
import threading

import torch
from transformers import PreTrainedTokenizerBase

from .loading import ModelLoadError, load_tokenizer
from .grammar_spec import GrammarError, first_line, load_llguidance
from .ragged_pass import shared_prefix

MATCHERS_KEPT = 64  # a replica's compiled grammars, least recently used given back first
# How llguidance stops once a grammar is complete (the end of the text is all that is left); any
# other stop is a limit of its own or an error: the grammar is stuck.
COMPLETE = ("NoExtension", "NoExtensionBias", "EndOfSentence")


# A byte's 8 bits, lowest first: unpacks llguidance's bitmask (little-endian words) a byte at a time.
_BITS = ((torch.arange(256).unsqueeze(-1) >> torch.arange(8)) & 1).bool()


class GrammarCompiler:
    """A model's grammars: its tokenizer as llguidance sees it and a pristine matcher per grammar."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = _grammar_tokenizer(tokenizer)
        self.eos = tokenizer.eos_token_id
        self._matchers: OrderedDict[str, object] = OrderedDict()  # llguidance.LLMatcher

    def state(self, grammar: str, output: Sequence[int] = ()) -> GrammarState:
        """A session's grammar, having consumed ``output`` (a reopened session's output so far)."""
        pristine = self._matchers.pop(grammar, None)
        if pristine is None:
            pristine = load_llguidance().LLMatcher(self.tokenizer, grammar, log_level=0)
            if pristine.is_error():
                raise GrammarError(f"the grammar does not compile: {first_line(pristine.get_error())}")
        self._matchers[grammar] = pristine
        while len(self._matchers) > MATCHERS_KEPT:
            self._matchers.popitem(last=False)
        state = GrammarState(pristine, self.eos, self.tokenizer.vocab_size)
        state.commit(output)
        return state


def _grammar_tokenizer(tokenizer: PreTrainedTokenizerBase):
    """The tokenizer as llguidance reads it: from its serialised form (byte-level BPE and the
    like); a tokenizer whose decoder it does not know (a word-level one) by each token's text."""
    llguidance = load_llguidance()
    try:
        return llguidance.hf.from_tokenizer(tokenizer)
    except ValueError:
        return llguidance.LLTokenizer(llguidance.TokenizerWrapper(_TokenTexts(tokenizer)))


class _TokenTexts:
    """What llguidance's TokenizerWrapper reads of a tokenizer: each token's bytes, and encoding."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.eos_token_id = tokenizer.eos_token_id
        self.bos_token_id = tokenizer.bos_token_id
        self.special_token_ids = list(tokenizer.all_special_ids)
        self.tokens = [tokenizer.decode([token]).encode() for token in range(len(tokenizer))]
        self._encode = tokenizer.encode

    def __call__(self, text: str) -> list[int]:
        return self._encode(text, add_special_tokens=False)


_compilers: dict[str, GrammarCompiler | GrammarError] = {}
_compilers_lock = threading.Lock()


def grammar_compiler(tokenizer_source: str) -> GrammarCompiler:
    """A model process's grammars (a failure to build them remembered too, so a worker without a
    tokenizer says so once). Building takes about a second for a large vocabulary: a worker warms
    it at start-up (``warm_grammars``) so that its first request with a grammar does not stall
    every session's replies."""
    with _compilers_lock:
        if tokenizer_source not in _compilers:
            try:
                _compilers[tokenizer_source] = GrammarCompiler(load_tokenizer(tokenizer_source))
            except ModelLoadError as exc:
                _compilers[tokenizer_source] = GrammarError(f"no tokenizer to build grammars with: {exc}")
            except GrammarError as exc:  # llguidance missing
                _compilers[tokenizer_source] = exc
        built = _compilers[tokenizer_source]
    if isinstance(built, GrammarError):
        raise built
    return built


def warm_grammars(tokenizer_source: str) -> None:
    """Build a model's grammars in the background (a worker's start-up; a failure waits for the
    first request that needs them)."""
    def build() -> None:
        try:
            grammar_compiler(tokenizer_source)
        except GrammarError:
            pass

    threading.Thread(target=build, name="grammar-warm-up", daemon=True).start()


def no_grammars() -> GrammarCompiler:
    """Where a session's model has no tokenizer to build grammars with."""
    raise GrammarError("this worker serves no structured output (it has no tokenizer for grammars)")


class GrammarState:
    """One session's place in its grammar: masks verify rows, consumes what the session commits."""

    def __init__(self, pristine, eos: int | None, vocab_size: int) -> None:
        self.pristine = pristine  # an llguidance.LLMatcher at the output's start, never consumed into
        self.matcher = pristine.deep_copy()
        self.eos = eos
        self.vocab_size = vocab_size  # the ids llguidance knows: it stops for good on any other
        self.consumed: list[int] = []  # the output the matcher has consumed (``commit``, ``sync``)

    @property
    def ended(self) -> bool:
        """The grammar can take nothing more but the end of the text (it is complete, or stuck)."""
        return self.matcher.is_stopped()

    @property
    def stuck(self) -> str:
        """Why the grammar can take no further token though it is not complete ("": it can, or it is
        complete and takes the end of the text). llguidance stops so on a limit of its own (a
        lexer or parser too complex) or an error."""
        if self.matcher.is_error():
            return self.matcher.get_error() or "error"
        if self.matcher.is_stopped() and (not self.matcher.is_accepting() or self.matcher.stop_reason() not in COMPLETE):
            return str(self.matcher.stop_reason())
        return ""

    def allowed_prefix(self, ids: Sequence[int]) -> int:
        """How many of ``ids`` the grammar allows in a row from here (nothing consumed). An id
        llguidance does not know (a padded vocabulary's) is never allowed, and never shown to it."""
        known = next((i for i, token in enumerate(ids) if not 0 <= token < self.vocab_size), len(ids))
        return self.matcher.validate_tokens(list(ids[:known])) if known else 0

    def mask_chain(self, logits: torch.Tensor, ids: Sequence[int]) -> torch.Tensor:
        """``logits`` [k+1, V] (row i after the first i of ``ids``) with what the grammar forbids at
        -inf. Rows past the first forbidden token are left as they are: that token is rejected
        there, so the verdict never reads them."""
        allowed = self.allowed_prefix(ids)
        words = [self._words()]
        consumed = 0
        for token in ids[:min(allowed, len(logits) - 1)]:
            consumed += self._advance([token])
            words.append(self._words())
        self._back(consumed)
        return self._masked(logits, words)

    def mask_tree(self, logits: torch.Tensor, ids: Sequence[int], parents: Sequence[int]) -> torch.Tensor:
        """A token tree's rows ([T+1, V]: the root, then after each node), each masked along its path;
        a node the grammar forbids (or one under it) keeps its row unmasked, never read."""
        words = [self._words()]
        paths: list[list[int] | None] = []
        for node, parent in enumerate(parents):
            above = [] if parent < 0 else paths[parent]
            path = None if above is None else above + [ids[node]]
            if path is not None and self.allowed_prefix(path) < len(path):
                path = None
            paths.append(path)
            if path is None:
                words.append(None)
                continue
            consumed = self._advance(path)
            words.append(self._words())
            self._back(consumed)
        return self._masked(logits, words)

    def sync(self, tokens: Sequence[int]) -> bool:
        """Bring the matcher to the output ``tokens`` from where it is: roll back to what they
        share, consume the rest. A draft's session uses this alone (its output moves by verdicts,
        resyncs and adopted branches alike). False where the grammar forbids one of ``tokens`` (a
        draft's guess of a correction): the matcher then stops before it."""
        shared = shared_prefix(self.consumed, tokens)
        self._back(len(self.consumed) - shared, keep=shared)
        rest = list(tokens[shared:])
        allowed = self.allowed_prefix(rest) if rest and not self.matcher.is_stopped() else len(rest)
        self.consumed += rest[:self._advance(rest[:allowed])]
        return allowed == len(rest)

    def mask_next(self, logits: torch.Tensor) -> torch.Tensor:
        """One row of logits [1, V] masked to what the grammar allows now."""
        return self._masked(logits, [self._words()])

    def commit(self, tokens: Sequence[int]) -> None:
        """The session committed ``tokens`` (drawn from masked rows, so the grammar allows them)."""
        self.consumed += tokens[:self._advance(tokens)]

    def _back(self, n: int, keep: int | None = None) -> None:
        """Undo the last ``n`` tokens consumed (``keep``: the ``consumed`` tokens that stay). Where
        llguidance cannot (a limit of its own stopped it in between), the matcher is built again
        from the pristine one and what stays: a rejected proposal never costs the committed state."""
        if keep is not None:
            del self.consumed[keep:]
        if n and not self.matcher.rollback(n):
            self.matcher = self.pristine.deep_copy()
            kept = self._advance(self.consumed)
            del self.consumed[kept:]

    def _advance(self, tokens: Sequence[int]) -> int:
        """Consume ``tokens`` (each allowed) up to where the grammar stops: what follows is the end
        of the text (EOS), which the matcher takes without counting it, so a rollback past it would
        undo one token too many. How many were consumed. A token refused after all (llguidance
        disagreeing with its own mask) leaves the matcher in error: ``stuck`` says so, and the
        session ends its text there rather than fail."""
        for consumed, token in enumerate(tokens):
            if self.matcher.is_stopped() or not self.matcher.consume_token(token):
                return consumed
        return len(tokens)

    def _words(self) -> bytes:
        """The grammar's allowed tokens now, packed: bit j of byte b is token 8b + j."""
        return self.matcher.compute_bitmask()

    def _masked(self, logits: torch.Tensor, words: list[bytes | None]) -> torch.Tensor:
        masked = logits.float().clone()
        rows = [i for i, row in enumerate(words) if row is not None][:len(masked)]
        packed = torch.frombuffer(bytearray(b"".join(words[i] for i in rows)), dtype=torch.uint8)
        allowed = _BITS[packed.view(len(rows), -1).int()].flatten(1)[:, :masked.shape[-1]]  # [r, V] or narrower
        if allowed.shape[-1] < masked.shape[-1]:  # ids the tokenizer does not have: never allowed
            allowed = torch.nn.functional.pad(allowed, (0, masked.shape[-1] - allowed.shape[-1]))
        # A grammar that cannot continue (nothing allowed) ends the text: the end-of-text token only.
        stuck = ~allowed.any(-1)
        if stuck.any():  # (a tokenizer without EOS: left unmasked, the session ends on ``stuck``)
            if self.eos is not None:
                allowed[stuck, self.eos] = True
            else:
                allowed[stuck] = True
        if len(rows) == len(masked):
            return masked.masked_fill_(~allowed, float("-inf"))
        index = torch.tensor(rows, dtype=torch.long)
        masked[index] = masked[index].masked_fill(~allowed, float("-inf"))
        return masked
