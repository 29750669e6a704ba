"""The OpenAI-compatible HTTP API, called by the official ``openai`` client.

Three layers: the body checks alone; the real aiohttp server over the router's real service with
in-process workers (``fake_workers``: the workers' own session code, no Ray), where a tokenizer
with a chat template, the token and every error status are set up cheaply; and the real cluster,
where the API's greedy text must equal the gRPC API's.
"""

from __future__ import annotations

import asyncio
import copy
import json
import random
import re
import threading
import time
import urllib.error
import urllib.request

import grpc
import jsonschema
import openai
import pytest

from specserve.proto.v1 import specserve_pb2 as pb
from specserve.router.config import RouterConfig
from specserve.router.openai_api import ApiError, OpenAIServer, chat_prompt, chat_request, completion_request
from specserve.router.service import SpecServeService
from specserve.router.tasks import TaskResolver
from specserve.router.validation import Limits
from specserve.workers.request import GenerationParams
from specserve.workers.security import SecuritySettings

from fake_workers import DRAFT, FakeDirectory, FakeWorker

MODEL = "tiny"
PROMPT = "def parse_header(line):\n    "
TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")
TOKEN = "s3cret-token"


# --- the body checks -------------------------------------------------------------------------


@pytest.mark.parametrize("body, status, words", [
    ({"model": MODEL, "prompt": "x", "n": 2}, 400, "n must be 1"),
    ({"model": MODEL, "prompt": "x", "echo": True}, 400, "echo is not supported"),
    ({"model": MODEL, "prompt": "x", "logit_bias": {"x": 1}}, 400, "logit_bias maps token ids to numbers"),
    ({"model": MODEL, "prompt": "x", "presence_penalty": "high"}, 400, "presence_penalty must be a number"),
    ({"model": MODEL, "prompt": "x", "logprobs": True}, 400, "logprobs must be an integer"),
    ({"model": MODEL, "prompt": "x", "best_of": 2}, 400, "best_of is not supported"),
    ({"model": MODEL, "prompt": "x", "frobnicate": 1}, 400, "unknown field 'frobnicate'"),
    ({"model": MODEL, "prompt": ["a", "b"]}, 400, "one prompt per request"),
    ({"model": MODEL, "prompt": [1, 2, 3]}, 400, "token-id prompts are not accepted"),
    ({"model": MODEL, "prompt": "x", "max_tokens": "8"}, 400, "max_tokens must be an integer"),
    ({"model": MODEL, "prompt": "x", "temperature": "hot"}, 400, "temperature must be a number"),
    ({"model": MODEL, "prompt": "x", "stop": [1]}, 400, "stop must be a string or a list of strings"),
    ({"model": MODEL, "prompt": "x", "speculation": "maybe"}, 400, "speculation must be one of auto, on, off"),
    ({"model": MODEL, "prompt": "x", "stream_options": {"include_usage": True}}, 400, "needs stream: true"),
    ({"model": "gpt-4", "prompt": "x"}, 404, "serves 'tiny'"),
    ([1, 2], 400, "JSON object"),
])
def test_a_bad_body_is_refused_naming_the_field(body, status, words):
    with pytest.raises(ApiError) as caught:
        completion_request(body, MODEL)
    assert caught.value.body()["error"]["message"].count(words) == 1
    assert caught.value.response().status == status


def test_a_body_becomes_the_grpc_request_with_openais_defaults():
    request = completion_request({"model": MODEL, "prompt": ["hi"], "stop": "\n", "max_tokens": 8, "seed": 3,
                                  "task": "code", "draft": "d", "k": 2, "top_k": 5, "speculation": "off",
                                  "user": "ignored", "logprobs": None, "n": 1}, MODEL)
    g = request.generate
    assert (g.prompt, list(g.stop), g.max_tokens, g.seed, g.task, g.draft, g.k, g.top_k) == ("hi", ["\n"], 8, 3, "code",
                                                                                              "d", 2, 5)
    assert g.speculation == pb.SPECULATION_OFF and g.temperature == 1.0 and g.top_p == 1.0  # OpenAI's defaults
    assert g.HasField("seed") and not request.stream


def test_chat_needs_a_template_and_renders_the_conversation(tiny_engine):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    bare = copy.deepcopy(tiny_engine.tokenizer)
    bare.chat_template = None  # a model's tokenizer without one
    with pytest.raises(ApiError, match="has no chat template"):
        chat_prompt(messages, bare)
    # the zoo's own (cluster/zoo/tokenizer.py): a role's marker on a line, then the turn
    assert chat_prompt(messages, tiny_engine.tokenizer) == "<|system|>\nbe brief\n<|user|>\nhi\n<|assistant|>\n"
    templated = copy.deepcopy(tiny_engine.tokenizer)
    templated.chat_template = TEMPLATE
    assert chat_prompt(messages, templated) == "<system>be brief\n<user>hi\n<assistant>"
    templated.chat_template = "{{ bos_token }}" + TEMPLATE  # a template that writes BOS: one BOS in all
    assert chat_prompt(messages, templated) == "<system>be brief\n<user>hi\n<assistant>"
    with pytest.raises(ApiError, match=r"messages\[0\] must be an object whose role"):
        chat_prompt([{"role": "robot", "content": "x"}], templated)
    with pytest.raises(ApiError, match="not both"):
        chat_request({"model": MODEL, "messages": messages, "max_tokens": 1, "max_completion_tokens": 2}, MODEL, templated)


# --- the real HTTP server, in-process workers ------------------------------------------------


class LocalApi:
    """The service and its HTTP front on a loop of their own, as in the router process."""

    def __init__(self, tiny_engine, security: SecuritySettings, with_target: bool = True) -> None:
        tokenizer = copy.deepcopy(tiny_engine.tokenizer)
        tokenizer.chat_template = TEMPLATE
        workers = [FakeWorker("draft", "d0", tiny_engine.target, grammars=lambda: tiny_engine.grammars)]
        if with_target:
            workers.append(FakeWorker("target", "t0", tiny_engine.target, grammars=lambda: tiny_engine.grammars))
        tasks = {"code": (DRAFT,)}
        limits = Limits(tasks=tasks, drafts=(DRAFT,), context_window=tiny_engine.context_window)
        # No target to wait for long: a request without one is answered 503 in a second.
        config = RouterConfig(tasks=tasks, default_task="code", max_concurrent_requests=2, max_queued_requests=0,
                              timeouts={"target_wait_seconds": 1.0})
        self.service = SpecServeService(tokenizer, limits, FakeDirectory(*workers), config,
                                        TaskResolver(frozenset(tasks), "code", None, 0.6), random.Random(0))
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        self.server = OpenAIServer(self.service, MODEL, security)
        port = self.call(self.server.start("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{port}/v1"

    def call(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(60)

    def client(self, key: str = "unused") -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url, api_key=key, max_retries=0, timeout=60)

    def close(self) -> None:
        self.call(self.server.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)


@pytest.fixture(scope="module")
def local_api(tiny_engine):
    api = LocalApi(tiny_engine, SecuritySettings())
    yield api
    api.close()


def target_alone(tiny_engine, prompt: str, max_tokens: int) -> str:
    return tiny_engine.generate(prompt, GenerationParams(max_tokens=max_tokens, speculation=False)).complete().text


def test_models_lists_the_served_model(local_api):
    assert [m.id for m in local_api.client().models.list().data] == [MODEL]


def test_a_greedy_completion_is_the_target_alone(local_api, tiny_engine):
    done = local_api.client().completions.create(model=MODEL, prompt=PROMPT, max_tokens=24, temperature=0,
                                                 extra_body={"speculation": "on"})
    assert done.choices[0].text == target_alone(tiny_engine, PROMPT, 24)
    assert done.choices[0].finish_reason in ("stop", "length") and done.object == "text_completion"
    stats = done.model_extra["specserve"]
    assert stats["draft"] == DRAFT and stats["task"] == "code" and int(stats["target_passes"]) >= 1
    prompt_tokens = len(local_api.service.tokenizer.encode(PROMPT)) + 1  # BOS
    assert done.usage.prompt_tokens == prompt_tokens
    assert done.usage.total_tokens == prompt_tokens + done.usage.completion_tokens > prompt_tokens


def test_a_streamed_completion_concatenates_to_the_unary_one(local_api):
    client = local_api.client()
    whole = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=24, temperature=0)
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=24, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    finished = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finished) == 1 and finished[0].choices[0].finish_reason == whole.choices[0].finish_reason
    assert "target_passes" in finished[0].model_extra["specserve"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_chat_uses_the_template_unary_and_streamed(local_api, tiny_engine):
    client = local_api.client()
    messages = [{"role": "user", "content": "def main():"}]
    whole = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, temperature=0)
    expected = target_alone(tiny_engine, "<user>def main():\n<assistant>", 16)
    assert whole.choices[0].message.content == expected and whole.choices[0].message.role == "assistant"
    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, max_completion_tokens=16,
                                                 temperature=0, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == expected
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason


def test_sampled_completions_follow_the_seed(local_api):
    """A seed replays a sample given the same draft and k (the policy's own choice may differ)."""
    client = local_api.client()
    pinned = {"draft": DRAFT, "k": 3, "speculation": "on"}
    runs = [client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=16, seed=seed,
                                      extra_body=pinned).choices[0].text for seed in (5, 5)]
    assert runs[0] == runs[1]


@pytest.mark.parametrize("kwargs, error, words", [
    ({"n": 2}, openai.BadRequestError, "n must be 1"),
    ({"max_tokens": 0}, openai.BadRequestError, "max_tokens"),
    ({"temperature": -1.0}, openai.BadRequestError, "temperature must be 0 (greedy)"),
    ({"extra_body": {"task": "poetry"}}, openai.BadRequestError, "unknown task 'poetry'"),
    ({"model": "gpt-4"}, openai.NotFoundError, "is not served here"),
])
def test_errors_have_openais_shape_and_status(local_api, kwargs, error, words):
    args = {"model": MODEL, "prompt": PROMPT, "max_tokens": 4} | kwargs
    with pytest.raises(error) as caught:
        local_api.client().completions.create(**args)
    assert words in caught.value.body["message"]


def test_a_full_router_answers_429_and_no_worker_503(local_api, tiny_engine):
    service = local_api.service
    local_api.call(service.admission.enter())
    local_api.call(service.admission.enter())  # both turns taken; no queue
    try:
        with pytest.raises(openai.RateLimitError, match="RESOURCE_EXHAUSTED|queue|limit"):
            local_api.client().completions.create(model=MODEL, prompt=PROMPT, max_tokens=4)
    finally:
        service.admission.leave()
        service.admission.leave()
    no_target = LocalApi(tiny_engine, SecuritySettings(), with_target=False)
    try:
        with pytest.raises(openai.InternalServerError) as caught:
            no_target.client().completions.create(model=MODEL, prompt=PROMPT, max_tokens=4)
        assert caught.value.status_code == 503
        stream = no_target.client().completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, stream=True)
        with pytest.raises(openai.APIError, match="no target"):
            list(stream)
    finally:
        no_target.close()
    # The turns came back: the next request runs.
    assert local_api.client().completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0).choices


def test_the_api_token_is_required(tiny_engine):
    api = LocalApi(tiny_engine, SecuritySettings(api_token=TOKEN))
    try:
        with pytest.raises(openai.AuthenticationError, match="Authorization: Bearer"):
            api.client("wrong").models.list()
        assert api.client(TOKEN).completions.create(model=MODEL, prompt=PROMPT, max_tokens=4).choices
        with urllib.request.urlopen(api.url.removesuffix("/v1") + "/health") as health:  # probes send no token
            assert health.status == 200
    finally:
        api.close()


def test_malformed_json_and_unknown_paths_answer_in_openais_shape(local_api):
    for path, data, status in (("/completions", b"{not json", 400), ("/embeddings", b"{}", 404)):
        req = urllib.request.Request(local_api.url + path, data=data, headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(req)
        assert caught.value.code == status
        assert json.loads(caught.value.read())["error"]["message"]


# --- the real cluster ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster_api(service) -> openai.OpenAI:
    assert service.http_address, "the test service runs the OpenAI API"
    client = openai.OpenAI(base_url=f"http://{service.http_address}/v1", api_key="unused", max_retries=0, timeout=120)
    yield client
    client.close()


def test_the_services_greedy_text_equals_the_grpc_apis(cluster_api, client, tiny_zoo):
    model = cluster_api.models.list().data[0].id
    assert model == f"zoo-{tiny_zoo.root.name}"
    for task in ("code", "prose"):
        prompt = tiny_zoo.prompts(task)[0]
        grpc_reply = client.generate(pb.GenerateRequest(prompt=prompt, max_tokens=32, temperature=0.0, task=task))
        done = cluster_api.completions.create(model=model, prompt=prompt, max_tokens=32, temperature=0,
                                              extra_body={"task": task})
        assert done.choices[0].text == grpc_reply.text
        assert done.usage.completion_tokens == len(grpc_reply.token_ids)
        assert done.model_extra["specserve"]["task"] == task
        streamed = cluster_api.completions.create(model=model, prompt=prompt, max_tokens=32, temperature=0,
                                                  extra_body={"task": task, "speculation": "off"}, stream=True)
        assert "".join(c.choices[0].text for c in streamed if c.choices) == grpc_reply.text


def test_the_services_chat_on_the_zoo_answers_in_its_template(cluster_api, tiny_engine):
    """`make demo`'s service answers a chat: the zoo's target reads the zoo's chat template, and the
    answer is the greedy continuation of the rendered conversation, as a completion of it."""
    model = cluster_api.models.list().data[0].id
    messages = [{"role": "user", "content": "-- list users\nSELECT"}]
    chat = cluster_api.chat.completions.create(model=model, messages=messages, max_tokens=8, temperature=0)
    rendered = chat_prompt(messages, tiny_engine.tokenizer)
    done = cluster_api.completions.create(model=model, prompt=rendered, max_tokens=8, temperature=0)
    assert chat.choices[0].message.content == done.choices[0].text and chat.usage.completion_tokens > 0


def test_the_grpc_status_of_every_error_has_an_http_status():
    from specserve.router.openai_api import HTTP_STATUS
    from specserve.router.service import status_of
    from specserve.router.admission import Overloaded
    from specserve.router.directory import NoWorker
    from specserve.router.validation import InvalidRequest

    for exc in (InvalidRequest("x"), Overloaded("x"), NoWorker("x")):
        assert status_of(exc) in HTTP_STATUS
    assert grpc.StatusCode.UNAUTHENTICATED in HTTP_STATUS


def test_a_prompt_sharing_a_prefix_with_an_earlier_one_reuses_its_keys_and_says_so(cluster_api, client, tiny_zoo,
                                                                                  tiny_engine):
    """Through the service, prefix caching on (the default): a second prompt sharing the first's
    70-odd tokens takes their keys from the target replica's cache (whole blocks of 32), says how
    many in its stats and the OpenAI usage, and answers as the target alone, speculating or not.
    (A draft model, not the EAGLE-3 head: a target serving a head computes every prompt row.)"""
    system = "\n".join(tiny_zoo.prompts("sql")[:3]) + "\n"  # ~95 tokens
    first, second = system + tiny_zoo.prompts("sql")[3], system + tiny_zoo.prompts("sql")[4]
    model = cluster_api.models.list().data[0].id
    for speculation in ({"speculation": "off"}, {"speculation": "on", "draft": "sql"}):
        client.generate(pb.GenerateRequest(prompt=first, max_tokens=8, task="sql"))  # computes the prefix
        done = cluster_api.completions.create(model=model, prompt=second, max_tokens=16, temperature=0,
                                              extra_body={"task": "sql", **speculation})
        assert done.usage.prompt_tokens_details.cached_tokens >= 64
        assert int(done.model_extra["specserve"]["cached_prompt_tokens"]) == done.usage.prompt_tokens_details.cached_tokens
        assert done.choices[0].text == target_alone(tiny_engine, second, 16)
    deadline = time.monotonic() + 30  # GetStats says what the replica's last heartbeat did (every 2 s)
    while not any(w.prefix_reused_tokens for w in client.stats().workers if w.kind == "target"):
        assert time.monotonic() < deadline, "the target replica's heartbeat never reported its cache's hits"
        time.sleep(0.5)


def test_logprobs_are_the_targets_whichever_proposer_drafted_each_token(local_api, tiny_engine):
    """Completions' logprobs (n alternatives) and chat's (logprobs, top_logprobs), unary and
    streamed, speculating: one entry per output token, each the in-process target's own logprob."""
    client = local_api.client()
    alone = tiny_engine.generate(PROMPT, GenerationParams(max_tokens=16, speculation=False, logprobs=2)).complete()
    done = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=16, temperature=0, logprobs=2,
                                     extra_body={"speculation": "on"})
    got = done.choices[0].logprobs
    assert len(got.token_logprobs) == done.usage.completion_tokens == len(alone.token_ids)
    assert got.token_logprobs == pytest.approx(alone.logprobs.chosen, abs=1e-5)
    assert all(len(top) == 2 for top in got.top_logprobs) and got.text_offset[0] == 0
    assert "".join(got.tokens) == done.choices[0].text
    messages = [{"role": "user", "content": "def main():"}]
    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, temperature=0,
                                                 logprobs=True, top_logprobs=1, stream=True))
    content = [entry for c in chunks if c.choices and c.choices[0].logprobs for entry in c.choices[0].logprobs.content]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "".join(e.token for e in content) == text and all(len(e.top_logprobs) == 1 for e in content)
    assert all(e.logprob <= e.top_logprobs[0].logprob + 1e-6 for e in content)  # greedy: the top one is chosen
    with pytest.raises(openai.BadRequestError, match="logprobs must be 0..20"):
        client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, logprobs=21)
    with pytest.raises(openai.BadRequestError, match="top_logprobs needs logprobs: true"):
        client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4, top_logprobs=2)


def test_the_services_logprobs_are_the_targets_on_every_path(client, tiny_zoo, tiny_engine):
    """Through the service (gRPC): target-only decode runs, a draft model and the EAGLE-3 head
    each give one logprob per output token, the in-process target's own."""
    prompt = tiny_zoo.prompts("code")[0]
    alone = tiny_engine.generate(prompt, GenerationParams(max_tokens=16, speculation=False, logprobs=2)).complete()
    for speculation, draft in ((pb.SPECULATION_OFF, ""), (pb.SPECULATION_ON, "code"), (pb.SPECULATION_ON, "eagle3")):
        reply = client.generate(pb.GenerateRequest(prompt=prompt, max_tokens=16, task="code", logprobs=2,
                                                   speculation=speculation, draft=draft))
        assert list(reply.token_ids) == alone.token_ids
        assert [lp.logprob for lp in reply.logprobs] == pytest.approx(alone.logprobs.chosen, abs=1e-4), draft
        assert [list(lp.top_ids) for lp in reply.logprobs] == alone.logprobs.top_ids


def test_the_services_penalties_and_logit_bias_give_the_processed_targets_output(cluster_api, tiny_zoo, tiny_engine):
    """Through the service, target-only and speculating (so also after a reopen's output_start):
    the in-process processed target's greedy text; a token id outside the vocabulary is one 400."""
    from specserve.workers.sampling import LogitsProcessing

    model = cluster_api.models.list().data[0].id
    prompt = tiny_zoo.prompts("code")[1]
    processing = LogitsProcessing(((5, 2.0),), presence_penalty=0.5, frequency_penalty=0.5)
    alone = tiny_engine.generate(prompt, GenerationParams(max_tokens=16, speculation=False,
                                                          processing=processing)).complete()
    for extra in ({"speculation": "off"}, {"speculation": "on", "draft": "code"}):
        done = cluster_api.completions.create(model=model, prompt=prompt, max_tokens=16, temperature=0,
                                              presence_penalty=0.5, frequency_penalty=0.5, logit_bias={"5": 2},
                                              extra_body={"task": "code", **extra})
        assert done.choices[0].text == alone.text, extra
    with pytest.raises(openai.BadRequestError, match="outside the vocabulary"):
        cluster_api.completions.create(model=model, prompt=prompt, max_tokens=4, logit_bias={"999999": 1})


# --- structured output -----------------------------------------------------------------------

PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age"],
          "properties": {"name": {"enum": ["ada", "bob"]}, "age": {"type": "integer", "minimum": 0, "maximum": 99}}}
WEATHER = {"type": "function", "function": {"name": "weather", "parameters": PERSON}}
CLOCK = {"type": "function", "function": {"name": "clock", "parameters": {
    "type": "object", "additionalProperties": False, "required": ["zone"],
    "properties": {"zone": {"enum": ["utc", "cet"]}}}}}


@pytest.mark.parametrize("extra, words", [
    ({"response_format": {"type": "xml"}}, "response_format must be"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "needs json_schema.schema"),
    ({"structured_outputs": {"regex": "a", "grammar": "b"}}, "takes one of json"),
    ({"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}}, "ask for one output format"),
    ({"tools": [WEATHER]}, "tool_choice auto is not served"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "naming one of"),
    ({"tools": [{"type": "function"}], "tool_choice": "required"}, "tools must be a list of"),
    ({"tool_choice": "required"}, "tool_choice needs tools"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": "weather"}}, "naming one of"),
])
def test_a_bad_structured_output_field_is_refused_naming_it(tiny_engine, extra, words):
    templated = copy.deepcopy(tiny_engine.tokenizer)
    templated.chat_template = TEMPLATE
    with pytest.raises(ApiError) as caught:
        chat_request({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]} | extra, MODEL, templated)
    assert words in caught.value.body()["error"]["message"] and caught.value.response().status == 400


def test_a_tools_definitions_move_to_the_schemas_root(tiny_engine):
    """pydantic writes a tool's nested models under $defs, referenced from the root of its
    parameters; nested in the call's schema, they move to its root, renamed per tool."""
    from specserve.workers.grammar_spec import GrammarSpec

    guest = {"type": "object", "properties": {"name": {"type": "string"}, "friend": {"$ref": "#/$defs/Guest"}},
             "required": ["name"]}
    book = {"type": "function", "function": {"name": "book", "parameters": {
        "type": "object", "properties": {"guest": {"$ref": "#/$defs/Guest"}}, "required": ["guest"],
        "$defs": {"Guest": guest}}}}
    templated = copy.deepcopy(tiny_engine.tokenizer)
    templated.chat_template = TEMPLATE
    request = chat_request({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "tools": [book, CLOCK],
                            "tool_choice": "required"}, MODEL, templated)
    schema = json.loads(request.generate.structured_output.json_schema)
    GrammarSpec("json_schema", json.dumps(schema)).compiled()
    call = {"name": "book", "arguments": {"guest": {"name": "ada", "friend": {"name": "bob"}}}}
    jsonschema.validate(call, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"name": "book", "arguments": {"guest": {"friend": {}}}}, schema)


def constrained_alone(tiny_engine, prompt: str, grammar, max_tokens: int = 48):
    params = GenerationParams(max_tokens=max_tokens, speculation=False, grammar=grammar)
    return tiny_engine.generate(prompt, params).complete()


def test_response_format_and_tools_through_the_official_client(local_api, tiny_engine):
    """json_schema, a regex (structured_outputs), a required and a named tool call, unary and
    streamed: each output follows its grammar and is the constrained target's greedy output."""
    from specserve.workers.grammar_spec import GrammarSpec

    client = local_api.client()
    schema = GrammarSpec("json_schema", json.dumps(PERSON))
    alone = constrained_alone(tiny_engine, "<user>who\n<assistant>", schema)  # the chat below, rendered
    done = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "who"}], max_tokens=48,
                                          temperature=0, response_format={"type": "json_schema", "json_schema": {
                                              "name": "person", "schema": PERSON, "strict": True}})
    assert done.choices[0].message.content == alone.text and done.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(alone.text), PERSON)
    done = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "who"}], max_tokens=48,
                                          temperature=0, response_format={"type": "json_object"})
    text = done.choices[0].message.content  # any object: the tiny model writes one long string in it
    assert text.startswith("{") and (done.choices[0].finish_reason == "length" or isinstance(json.loads(text), dict))
    done = client.completions.create(model=MODEL, prompt="x = ", max_tokens=24, temperature=0,
                                     extra_body={"structured_outputs": {"regex": "[a-c]{2,6}!"}})
    assert re.fullmatch("[a-c]{2,6}!", done.choices[0].text)
    messages = [{"role": "user", "content": "what time is it"}]
    for choice, names in (("required", {"weather", "clock"}), ({"type": "function", "function": {"name": "clock"}},
                                                              {"clock"})):
        reply = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER, CLOCK],
                                               tool_choice=choice, max_tokens=48, temperature=0)
        call = reply.choices[0].message.tool_calls[0]
        assert reply.choices[0].finish_reason == "tool_calls" and reply.choices[0].message.content is None
        assert call.function.name in names and call.id.startswith("call_")
        parameters = (WEATHER if call.function.name == "weather" else CLOCK)["function"]["parameters"]
        jsonschema.validate(json.loads(call.function.arguments), parameters)
        streamed = list(client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER, CLOCK],
                                                       tool_choice=choice, max_tokens=48, temperature=0, stream=True))
        deltas = [c.choices[0].delta.tool_calls for c in streamed if c.choices and c.choices[0].delta.tool_calls]
        assert len(deltas) == 1 and deltas[0][0].function.arguments == call.function.arguments
        assert streamed[-1].choices[0].finish_reason == "tool_calls"
    with pytest.raises(openai.BadRequestError, match="does not compile"):
        client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4, response_format={
            "type": "json_schema", "json_schema": {"name": "bad", "schema": {"type": "nonsense"}}})


def test_a_stuck_grammar_ends_the_answer_with_finish_reason_grammar(local_api, monkeypatch):
    from test_grammar import stick_after

    stick_after(monkeypatch, 3)
    done = local_api.client().completions.create(model=MODEL, prompt="x = ", max_tokens=24, temperature=0,
                                                 extra_body={"structured_outputs": {"regex": "[a-c]{20}"},
                                                             "speculation": "off"})  # a decode run: ends at 3
    assert done.choices[0].finish_reason == "grammar" and len(done.choices[0].text) == 3


def test_the_services_structured_output_is_the_constrained_targets_on_every_path(cluster_api, client, tiny_zoo,
                                                                                 tiny_engine):
    """Through the real service: target-only, a draft, prompt lookup, over HTTP and gRPC, greedy:
    the in-process constrained target's text; a regex that does not compile is one 400."""
    from specserve.workers.grammar_spec import GrammarSpec

    model = cluster_api.models.list().data[0].id
    prompt = tiny_zoo.prompts("code")[1]
    alone = constrained_alone(tiny_engine, prompt, GrammarSpec("json_schema", json.dumps(PERSON)))
    jsonschema.validate(json.loads(alone.text), PERSON)
    for extra in ({"speculation": "off"}, {"speculation": "on", "draft": "code"}, {"speculation": "on",
                                                                                   "draft": "ngram"}):
        # The completions API has response_format as an extension (the official client's, in extra_body).
        body = {"task": "code", "response_format": {"type": "json_schema", "json_schema": {"name": "p",
                                                                                          "schema": PERSON}}}
        done = cluster_api.completions.create(model=model, prompt=prompt, max_tokens=48, temperature=0,
                                              extra_body=body | extra)
        assert done.choices[0].text == alone.text, extra
    reply = client.generate(pb.GenerateRequest(prompt=prompt, max_tokens=48, temperature=0.0, task="code",
                                               speculation=pb.SPECULATION_ON,
                                               structured_output=pb.StructuredOutput(json_schema=json.dumps(PERSON))))
    assert reply.text == alone.text and reply.finish_reason == pb.FINISH_REASON_EOS
    with pytest.raises(openai.BadRequestError, match="unclosed character class"):
        cluster_api.completions.create(model=model, prompt=prompt, max_tokens=4,
                                       extra_body={"structured_outputs": {"regex": "[a-"}})
