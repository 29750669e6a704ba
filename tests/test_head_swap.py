"""A new version of an EAGLE-3 head served without a restart (cluster/pool.py ``swap_draft``, through
the control deployment): under load on the session's service, every request completes with the
target's own tokens; sessions open on the old head finish on it (their acceptance stays the old
head's), and sessions opened after draft with the new one. The test swaps in a head whose output
layer is negated (it proposes what the target least expects: acceptance near 0, output unchanged),
then the zoo's own head back."""

from __future__ import annotations

import json
import shutil
import threading
import time

from ray import serve
from safetensors.torch import load_file, save_file

from specserve.bench.faults import inspect, workers
from specserve.cluster.app import CONTROL_DEPLOYMENT
from specserve.cluster.zoo.head import HEAD_PATH
from specserve.proto.v1 import specserve_pb2 as pb

CLIENTS = 6
MAX_TOKENS = 96


def negated_head(zoo_head, out):
    """A copy of the zoo's head that proposes its least likely token: a version that loses."""
    shutil.copytree(zoo_head, out)
    weights = load_file(out / "model.safetensors")
    weights["lm_head.weight"] = -weights["lm_head.weight"]
    save_file(weights, out / "model.safetensors", metadata={"format": "pt"})
    return out


def negated_draft(zoo_draft, out):
    """A copy of a zoo draft model (tied embeddings) whose output layer proposes its least likely token."""
    shutil.copytree(zoo_draft, out)
    weights = load_file(out / "model.safetensors")
    weights["lm_head.weight"] = -weights["model.embed_tokens.weight"]
    save_file(weights, out / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps(config | {"tie_word_embeddings": False}))
    return out


def test_a_head_swapped_under_load_loses_no_request_and_serves_new_sessions(service, client, tiny_zoo, tmp_path):
    control = serve.get_deployment_handle(CONTROL_DEPLOYMENT, app_name=service.app_name)
    zoo_head = tiny_zoo.root / HEAD_PATH
    prompts = [tiny_zoo.prompts(task)[0] for task in tiny_zoo.tasks]
    expected = {p: list(client.generate(pb.GenerateRequest(prompt=p, max_tokens=MAX_TOKENS,
                                                           speculation=pb.SPECULATION_OFF)).token_ids)
                for p in prompts}

    def ask(prompt: str) -> pb.GenerateResponse:
        return client.generate(pb.GenerateRequest(prompt=prompt, max_tokens=MAX_TOKENS, draft="eagle3", k=4,
                                                  speculation=pb.SPECULATION_ON), timeout=120)

    replies: list[tuple[str, pb.GenerateResponse, float]] = []  # (prompt, reply, when it came)
    started = threading.Barrier(CLIENTS + 1)

    def load(i: int) -> None:
        started.wait()
        prompt = prompts[i % len(prompts)]
        replies.append((prompt, ask(prompt), time.monotonic()))

    try:
        threads = [threading.Thread(target=load, args=(i,)) for i in range(CLIENTS)]
        for thread in threads:
            thread.start()
        started.wait()
        # Every request's session open on the zoo's head before the swap (a request that opened
        # after it would draft with the new one from the start): asked of the workers, not timed.
        drafts = workers(client, "draft")
        deadline = time.monotonic() + 60
        while (sum(inspect("draft", w.address).live_sessions for w in drafts) + len(replies) < CLIENTS
               and time.monotonic() < deadline):
            time.sleep(0.01)
        swapped = control.swap_draft.remote("eagle3", str(negated_head(zoo_head, tmp_path / "negated"))).result(
            timeout_s=120)
        swapped_at = time.monotonic()
        assert swapped and all(w.startswith("draft-worker-") for w in swapped)
        for thread in threads:
            thread.join(timeout=120)
        assert len(replies) == CLIENTS
        after = [(p, ask(p), time.monotonic()) for p in prompts]
    finally:
        control.swap_draft.remote("eagle3", str(zoo_head)).result(timeout_s=120)  # the other tests' head
    running = [reply for _, reply, came in replies if came > swapped_at]  # still drafting when the head changed
    assert running, "no request was still running when the head changed"
    # They finished on the head they opened with: the zoo's accepts 0.9-1.0 here, so a session moved
    # to the negated one for its last 20% would fall below 0.8.
    assert acceptance(running) > 0.8, acceptance(running)
    for prompt, reply, _ in [*replies, *after]:
        assert reply.stats.draft == "eagle3" and reply.stats.route != "lost", reply.stats
        assert list(reply.token_ids) == expected[prompt]
    old, new = acceptance(r for _, r, _ in replies), acceptance(r for _, r, _ in after)
    assert new < 0.2 < old, (old, new)  # the zoo's head accepts 0.9-1.0 here; the negated one next to nothing
    assert acceptance([ask(prompts[0])]) > 0.5  # the zoo's head again


def acceptance(replies) -> float:
    proposed = accepted = 0
    for reply in replies:
        proposed, accepted = proposed + reply.stats.proposed_tokens, accepted + reply.stats.accepted_tokens
    return accepted / max(1, proposed)


def test_swap_head_says_what_to_fix_and_swaps_a_running_services_head(service, tiny_zoo, tmp_path, capsys):
    from specserve.cluster.cli import main

    zoo_head = tiny_zoo.root / HEAD_PATH
    app = ["--app", service.app_name]
    assert main(["swap-head", "--draft", "eagle3", "--head", str(tiny_zoo.draft_dir("sql")), *app]) == 2
    assert "not an EAGLE-3 head directory" in capsys.readouterr().err
    assert main(["swap-head", "--draft", "sql", "--head", str(zoo_head), *app]) == 2
    err = capsys.readouterr().err
    assert "draft 'sql' is a draft model" in err and "Traceback" not in err, err
    assert main(["swap-draft", "--draft", "sql", "--model", str(zoo_head), *app]) == 2
    assert "is a head (an EAGLE-3 head, or a model that carries an MTP module): give it as --head" in capsys.readouterr().err
    assert main(["swap-draft", "--draft", "nothing", "--model", str(tiny_zoo.draft_dir("sql")), *app]) == 2
    assert "serves no draft 'nothing'" in capsys.readouterr().err
    assert main(["swap-head", "--draft", "eagle3", "--head", str(zoo_head), *app]) == 0  # the same version again
    assert "draft eagle3 is now the one at" in capsys.readouterr().out


def test_a_worker_ray_restarts_is_swapped_to_the_new_head_again(service, client, tiny_zoo, tmp_path):
    """Ray restarts a crashed draft worker with the arguments it was first started with (the old
    head); the pool's supervision finds it and swaps it again."""
    import ray

    from specserve.bench.faults import kill, workers
    from specserve.cluster.config import NAMESPACE

    control = serve.get_deployment_handle(CONTROL_DEPLOYMENT, app_name=service.app_name)
    zoo_head = tiny_zoo.root / HEAD_PATH
    copy = shutil.copytree(zoo_head, tmp_path / "eagle3-v2")  # the same weights: a version by its path

    def sources(worker_id: str) -> dict[str, str] | None:
        """Where the worker's eagle3 and its versions come from."""
        try:
            served = ray.get(ray.get_actor(worker_id, namespace=NAMESPACE).sources.remote(), timeout=10)
        except Exception:  # noqa: BLE001  (restarting: not answering yet)
            return None
        return {name: source for name, source in served.items() if name.startswith("eagle3")}

    try:
        control.swap_draft.remote("eagle3", str(copy)).result(timeout_s=120)
        struck = workers(client, "draft")[0]
        assert sources(struck.worker_id) == {"eagle3": str(copy)}
        kill(struck, restart=True)
        deadline = time.monotonic() + 120
        while sources(struck.worker_id) != {"eagle3": str(copy)}:
            assert time.monotonic() < deadline, f"{struck.worker_id} serves {sources(struck.worker_id)} after its restart"
            time.sleep(1.0)
    finally:
        control.swap_draft.remote("eagle3", str(zoo_head)).result(timeout_s=120)
    deadline = time.monotonic() + 120
    while len(workers(client, "draft")) < 2:  # both answer again before the next test
        assert time.monotonic() < deadline, "the restarted draft worker did not come back"
        time.sleep(1.0)
    reply = client.generate(pb.GenerateRequest(prompt=tiny_zoo.prompts("sql")[0], max_tokens=16, draft="eagle3",
                                               speculation=pb.SPECULATION_ON), timeout=120)
    assert reply.stats.draft == "eagle3" and reply.stats.proposed_tokens > 0
