"""Checking a GenerateRequest at the edge: every field, with a message that says what to fix.

Anything wrong raises ``InvalidRequest``; the service answers it with INVALID_ARGUMENT. The ranges
themselves are defined once, in ``workers/request.py`` and ``workers/acceptance.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

from google.protobuf.message import DecodeError
from transformers import PreTrainedTokenizerBase

from specserve.proto.v1 import specserve_pb2 as pb
from specserve.workers.sampling import SamplingParams
from specserve.workers.grammar_spec import GrammarError, GrammarSpec
from specserve.workers.sampling import LogitsProcessing
from specserve.workers.prompt import encode_prompt
from specserve.workers.request import DEFAULT_K, DEFAULT_MAX_TOKENS, GenerationParams

from .segments import MAX_SEGMENT_CHARS, counted_segment

# Refuse absurd prompts before tokenizing them: no tokenizer makes a token of fewer than ~1 character,
# and this bound is far above any window's worth of text.
CHARS_PER_TOKEN_BOUND = 32
SPECULATION_NAMES = {pb.SPECULATION_AUTO: "auto", pb.SPECULATION_ON: "on", pb.SPECULATION_OFF: "off"}


class InvalidRequest(ValueError):
    """A request the client must change; the message names the field and what is allowed."""


@dataclass(frozen=True)
class ValidRequest:
    prompt_ids: list[int]
    params: GenerationParams
    task: str | None  # None: resolve it from the prompt
    draft: str | None  # the client's choice; None: the policy's
    k: int | None  # the client's fixed k; None: the policy's, adapted per step
    mode: str  # auto, on or off
    segment: str = ""  # as counted (router/segments.py): a listed name, "other", or "" for none


@dataclass(frozen=True)
class Limits:
    """What the deployment allows: its tasks and drafts, the context window."""

    tasks: dict[str, tuple[str, ...]]
    drafts: tuple[str, ...]
    context_window: int
    segments: frozenset[str] = frozenset()  # counted under their own names (router.segments)


def parse_request(data: bytes) -> pb.GenerateRequest:
    """Decode the wire bytes ourselves: protobuf refuses invalid UTF-8 in string fields, and that is
    the client's error (INVALID_ARGUMENT), not the server's."""
    try:
        return pb.GenerateRequest.FromString(data)
    except DecodeError as exc:
        raise InvalidRequest(f"request is not a valid GenerateRequest ({exc}); prompt, stop, task and draft "
                             f"must be valid UTF-8 strings") from None


def validate(request: pb.GenerateRequest, tokenizer: PreTrainedTokenizerBase, limits: Limits) -> ValidRequest:
    params = _params(request)
    if request.task and request.task not in limits.tasks:
        raise InvalidRequest(f"unknown task {request.task!r}; this deployment serves: "
                             f"{', '.join(sorted(limits.tasks))} (or leave task empty to have it classified)")
    vocab = len(tokenizer)
    outside = sorted(token for token in request.logit_bias if not 0 <= token < vocab)
    if outside:
        raise InvalidRequest(f"logit_bias names token ids outside the vocabulary (0..{vocab - 1}): {outside[:5]}")
    if request.draft and request.draft not in limits.drafts:
        raise InvalidRequest(f"unknown draft {request.draft!r}; this deployment has: {', '.join(sorted(limits.drafts))} "
                             f"(or leave draft empty for the policy's choice)")
    if len(request.segment) > MAX_SEGMENT_CHARS:
        raise InvalidRequest(f"segment is {len(request.segment)} characters; at most {MAX_SEGMENT_CHARS} (it names "
                             f"who the request is for, e.g. a tenant; leave it empty for none)")
    return ValidRequest(_prompt_ids(request.prompt, params, tokenizer, limits.context_window), params,
                        request.task or None, request.draft or None, request.k if request.HasField("k") else None,
                        SPECULATION_NAMES[request.speculation], counted_segment(request.segment, limits.segments))


def _params(request: pb.GenerateRequest) -> GenerationParams:
    if request.speculation not in SPECULATION_NAMES:
        raise InvalidRequest(f"speculation must be SPECULATION_AUTO, SPECULATION_ON or SPECULATION_OFF, "
                             f"got {request.speculation}")
    defaults = SamplingParams()
    try:
        sampling = SamplingParams(
            temperature=request.temperature if request.HasField("temperature") else defaults.temperature,
            top_k=request.top_k if request.HasField("top_k") else defaults.top_k,
            top_p=request.top_p if request.HasField("top_p") else defaults.top_p,
        )
        return GenerationParams(
            max_tokens=request.max_tokens if request.HasField("max_tokens") else DEFAULT_MAX_TOKENS,
            sampling=sampling,
            seed=request.seed if request.HasField("seed") else None,
            stop=tuple(request.stop),
            k=request.k if request.HasField("k") else DEFAULT_K,  # checks the range; the policy picks when unset
            speculation=request.speculation != pb.SPECULATION_OFF,
            logprobs=request.logprobs if request.HasField("logprobs") else None,
            processing=LogitsProcessing(tuple(sorted(request.logit_bias.items())), request.presence_penalty,
                                        request.frequency_penalty),
            grammar=_grammar(request),
        )
    except ValueError as exc:  # the configs' own messages name the field and its range
        raise InvalidRequest(str(exc)) from None


def _grammar(request: pb.GenerateRequest) -> GrammarSpec | None:
    """The request's structured output, compiled here (cached per source) so that a bad one is
    answered at the edge; a GrammarError (a ValueError) names what does not compile."""
    if not request.HasField("structured_output"):
        return None
    wanted = request.structured_output
    kind = wanted.WhichOneof("kind")
    if kind is None or (kind == "json_object" and not wanted.json_object):
        raise GrammarError("structured_output names no grammar: set one of json_schema, json_object, regex or lark")
    spec = GrammarSpec(kind, "" if kind == "json_object" else getattr(wanted, kind))
    spec.compiled()
    return spec


def _prompt_ids(prompt: str, params: GenerationParams, tokenizer: PreTrainedTokenizerBase, window: int) -> list[int]:
    if not prompt:
        raise InvalidRequest("prompt must not be empty")
    room = window - params.max_tokens
    if len(prompt) > window * CHARS_PER_TOKEN_BOUND:
        raise InvalidRequest(f"prompt is {len(prompt)} characters, far beyond the context window of {window} "
                             f"tokens; shorten it")
    ids = encode_prompt(tokenizer, prompt)
    if len(ids) > room:
        raise InvalidRequest(f"prompt is {len(ids)} tokens and max_tokens is {params.max_tokens}: together they "
                             f"exceed the context window of {window} tokens; shorten the prompt (to at most "
                             f"{max(room, 0)} tokens) or lower max_tokens")
    return ids
