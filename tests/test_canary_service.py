"""A canary on the session's service (`specserve canary`, cluster/canary.py): a new version of the
EAGLE-3 head, or of a draft model, served beside the draft on a share of its traffic, promoted when
its alpha beats the draft's and rolled back otherwise, with every request's output the target's own
throughout. The version that loses is the zoo's with its output layer negated (it proposes what the
target least expects: acceptance near 0, output unchanged)."""

from __future__ import annotations

import json
import shutil
import time
from concurrent.futures import ThreadPoolExecutor

import ray
from ray import serve

from specserve.cluster.app import CONTROL_DEPLOYMENT
from specserve.cluster.config import NAMESPACE
from specserve.cluster.zoo.head import HEAD_PATH
from specserve.proto.v1 import specserve_pb2 as pb
from specserve.router.canary import FINISHED, CanaryConfig

from conftest import CANARY_TASK
from test_head_swap import negated_draft, negated_head

MAX_TOKENS = 24
CLIENTS = 4
DECISION_SECONDS = 240.0
# A look every 6 requests per arm: the zoo's head and its negation are apart from the first.
CONFIG = CanaryConfig(share=0.5, confidence=0.95, min_requests=6, max_requests=60)


def run_canary(service, client, tiny_zoo, source, version: str, draft: str = "eagle3", decision: str = ""):
    """Start a canary of ``draft`` at ``source``, send the draft's traffic until it is decided (by an
    operator's ``decision`` after the first round, where one is given); returns its last status and
    every (prompt, reply) sent meanwhile."""
    control = serve.get_deployment_handle(CONTROL_DEPLOYMENT, app_name=service.app_name)
    prompts = [p for task in ("sql", "code", "math", "prose") for p in tiny_zoo.prompts(task)[:2]]
    status = control.start_canary.remote(draft, str(source), version, (CANARY_TASK,), CONFIG).result(timeout_s=120)
    assert status.state == "running" and status.version == f"{draft}@{version}", status

    def ask(prompt: str) -> tuple[str, pb.GenerateResponse]:
        return prompt, client.generate(pb.GenerateRequest(prompt=prompt, max_tokens=MAX_TOKENS, draft=draft,
                                                          task=CANARY_TASK, speculation=pb.SPECULATION_ON),
                                       timeout=120)

    replies = []
    deadline = time.monotonic() + DECISION_SECONDS
    with ThreadPoolExecutor(CLIENTS) as pool:
        while status.state not in FINISHED:
            assert time.monotonic() < deadline, f"no decision in {DECISION_SECONDS:.0f} s: {status}"
            replies += pool.map(ask, prompts)
            if decision and status.state == "running":
                control.end_canary.remote(draft, decision).result(timeout_s=60)
            status = next(s for s in control.canary_statuses.remote().result(timeout_s=30)
                          if s.canary_id == status.canary_id)
    return status, replies


def check_lossless(client, replies) -> None:
    expected = {}
    for prompt, reply in replies:
        if prompt not in expected:
            expected[prompt] = list(client.generate(pb.GenerateRequest(prompt=prompt, max_tokens=MAX_TOKENS,
                                                                       speculation=pb.SPECULATION_OFF)).token_ids)
        assert list(reply.token_ids) == expected[prompt], reply.stats
        assert reply.stats.route != "lost"


def canary_gauges(metrics_port: int, version: str, wait: float = 60.0) -> dict[str, float]:
    """The control's specserve_canary_* gauges of ``version`` on the service's scrape, once they
    say it finished: 'name{label="value"}' (the version's other labels left out) -> value."""
    import re
    import urllib.request

    deadline = time.monotonic() + wait
    while True:
        body = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
        found = {}
        for line in body.splitlines():
            match = re.match(r'ray_(specserve_canary_\w+)\{(.*)\} (\S+)$', line)
            if match and f'version="{version}"' in match[2]:
                label = re.search(r'(state|arm)="([^"]*)"', match[2])
                found[match[1] + (f'{{{label[1]}="{label[2]}"}}' if label else "")] = float(match[3])
        if any(found.get(f'specserve_canary_state{{state="{s}"}}') == 1.0 for s in FINISHED):
            return found
        assert time.monotonic() < deadline, f"no finished canary {version} in the scrape: {found}"
        time.sleep(1.0)


def sources(client, draft: str = "eagle3") -> list[dict[str, str]]:
    """Each draft worker's ``draft`` and its versions, and where each was loaded from."""
    served = [ray.get(ray.get_actor(w.worker_id, namespace=NAMESPACE).sources.remote(), timeout=30)
              for w in client.stats().workers if w.kind == "draft"]
    return [{name: source for name, source in drafts.items() if name.split("@")[0] == draft} for drafts in served]


def test_a_canary_that_accepts_less_is_rolled_back_and_the_draft_serves_on_unchanged(service, client, tiny_zoo,
                                                                                    tmp_path, metrics_port):
    zoo_head = str(tiny_zoo.root / HEAD_PATH)
    status, replies = run_canary(service, client, tiny_zoo, negated_head(tiny_zoo.root / HEAD_PATH, tmp_path / "neg"),
                                 "negated")
    assert status.state == "rolled back", status
    assert status.canary.alpha < 0.2 < status.base.alpha and status.looks >= 1, status
    assert "look" in status.reason
    routes = {reply.stats.draft for _, reply in replies}
    assert routes == {"eagle3", "eagle3@negated"}, routes  # both arms served
    check_lossless(client, replies)
    assert all(heads == {"eagle3": zoo_head} for heads in sources(client)), sources(client)  # retired, unchanged
    rows = [c for c in client.stats().canaries if c.version == "eagle3@negated"]
    assert rows and rows[-1].state == "rolled back" and rows[-1].canary_alpha < rows[-1].base_alpha
    scraped = canary_gauges(metrics_port, "eagle3@negated")
    assert scraped['specserve_canary_state{state="rolled back"}'] == 1.0, scraped
    assert scraped['specserve_canary_alpha{arm="canary"}'] < 0.2 < scraped['specserve_canary_alpha{arm="base"}']


def test_a_canary_that_accepts_more_is_promoted_and_serves_the_draft_from_then_on(service, client, tiny_zoo,
                                                                                 tmp_path):
    control = serve.get_deployment_handle(CONTROL_DEPLOYMENT, app_name=service.app_name)
    zoo_head = tiny_zoo.root / HEAD_PATH
    better = shutil.copytree(zoo_head, tmp_path / "v2")  # the zoo's head, a new version by its path
    control.swap_draft.remote("eagle3", str(negated_head(zoo_head, tmp_path / "neg"))).result(timeout_s=120)
    try:
        status, replies = run_canary(service, client, tiny_zoo, better, "v2")
        assert status.state == "promoted", status
        assert status.canary.alpha > 0.5 > status.base.alpha, status
        check_lossless(client, replies)
        assert all(heads == {"eagle3": str(better)} for heads in sources(client)), sources(client)
        after = client.generate(pb.GenerateRequest(prompt=tiny_zoo.prompts("sql")[0], max_tokens=MAX_TOKENS,
                                                   draft="eagle3", task=CANARY_TASK, speculation=pb.SPECULATION_ON),
                                timeout=120)
        # The negated head accepts next to nothing; the zoo's, here at the k the policy priced for the
        # negated one's record (1), 0.4-1.0 of its drafts.
        assert after.stats.draft == "eagle3" and after.stats.accepted_tokens > 0.2 * after.stats.proposed_tokens
    finally:
        control.swap_draft.remote("eagle3", str(zoo_head)).result(timeout_s=120)  # the other tests' head


def test_a_canary_says_what_to_fix_and_an_operator_can_roll_it_back(service, tiny_zoo, tmp_path, capsys):
    from specserve.cluster.cli import main

    app = ["--app", service.app_name]
    zoo_head = tiny_zoo.root / HEAD_PATH
    assert main(["canary", "--draft", "sql", "--head", str(zoo_head), *app]) == 2
    assert "draft 'sql' is a draft model" in capsys.readouterr().err
    assert main(["canary", "--draft", "nothing", "--model", str(tiny_zoo.draft_dir("sql")), *app]) == 2
    assert "no draft 'nothing' in the draft pool" in capsys.readouterr().err
    assert main(["canary", "--draft", "eagle3", "--head", str(zoo_head), "--tasks", "general", *app]) == 2
    assert "not served by draft 'eagle3'" in capsys.readouterr().err
    assert main(["canary", "--draft", "eagle3", "--head", str(zoo_head), "--share", "1.5", *app]) == 2
    assert "share must be in (0, 1)" in capsys.readouterr().err
    assert main(["canary", "--draft", "eagle3", "--roll-back", *app]) == 2
    assert "no canary running" in capsys.readouterr().err
    copy = shutil.copytree(zoo_head, tmp_path / "v3")
    assert main(["canary", "--draft", "eagle3", "--head", str(copy), "--tasks", "sql", *app]) == 0
    assert "canary eagle3@v3 of draft eagle3" in capsys.readouterr().out
    assert main(["canary", "--draft", "eagle3", "--head", str(copy), "--version", "v4", *app]) == 2
    assert "has a canary running" in capsys.readouterr().err
    assert main(["canary", "--draft", "eagle3", "--roll-back", *app]) == 0
    assert "rolling back (roll back by an operator)" in capsys.readouterr().out
    last = wait_finished(serve.get_deployment_handle(CONTROL_DEPLOYMENT, app_name=service.app_name))
    assert last.state == "rolled back" and last.version == "eagle3@v3"


def wait_finished(control, timeout: float = 60.0):
    """The latest canary once it is finished (its version retired, every router past it)."""
    deadline = time.monotonic() + timeout
    while (last := control.canary_statuses.remote().result(timeout_s=30)[-1]).state not in FINISHED:
        assert time.monotonic() < deadline, last
        time.sleep(0.5)
    return last


def test_sampled_output_keeps_the_targets_distribution_through_a_canary_and_swaps(service, tiny_zoo, tmp_path,
                                                                                   capsys):
    """`validate --address`'s two-sample test (the service's sampled draws against target-only ones,
    cluster/two_sample.py) on draft eagle3 while half its requests draft with a canary that proposes
    what the target least expects, and the head is swapped back and forth meanwhile: the rejection
    rule keeps every draw the target's, whichever version drafted it."""
    import threading

    from specserve.cluster.cli import main

    control = serve.get_deployment_handle(CONTROL_DEPLOYMENT, app_name=service.app_name)
    zoo_head = tiny_zoo.root / HEAD_PATH
    negated = negated_head(zoo_head, tmp_path / "neg")
    undecided = CanaryConfig(share=0.5, min_requests=1000, max_requests=1000)  # no look during the test
    control.start_canary.remote("eagle3", str(negated), "sampled", (CANARY_TASK,), undecided).result(timeout_s=120)
    done = threading.Event()

    def swap_back_and_forth() -> None:
        heads = [str(negated), str(zoo_head)]
        while not done.wait(1.0):
            heads.reverse()
            control.swap_draft.remote("eagle3", heads[0]).result(timeout_s=120)

    swapping = threading.Thread(target=swap_back_and_forth)
    swapping.start()
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": tiny_zoo.prompts(task)[0], "task": CANARY_TASK}) + "\n"
                               for task in ("sql", "code")))
    try:
        code = main(["validate", "--address", service.address, "--prompts", str(prompts), "--draft", "eagle3",
                     "--temperatures", "1.0", "--samples", "20", "--max-tokens", "12", "--seed", "1"])
    finally:
        done.set()
        swapping.join()
        control.end_canary.remote("eagle3", "roll back").result(timeout_s=60)
        control.swap_draft.remote("eagle3", str(zoo_head)).result(timeout_s=120)
        wait_finished(control)  # the next tests' requests of eagle3 all draft with the zoo's head
    captured = capsys.readouterr()
    assert code == 0, captured.err
    report = json.loads(captured.out)
    assert report["greedy"]["identical"] and report["sampled"]["tests"], report
    assert report["sampled"]["rejected"] == 0, report["sampled"]
    statuses = control.canary_statuses.remote().result(timeout_s=30)
    assert any(s.version == "eagle3@sampled" and s.canary.requests for s in statuses)  # the canary drafted some


def test_a_draft_models_canary_is_rolled_back_or_promoted_and_the_draft_swapped_back(service, client, tiny_zoo,
                                                                                     tmp_path):
    """The same for a draft model (not a head): a version loaded beside it with a KV pool of its own,
    its sessions opened and ended there; promoted, it serves as the draft as loaded (not loaded
    again), and the model before it goes once its sessions end."""
    control = serve.get_deployment_handle(CONTROL_DEPLOYMENT, app_name=service.app_name)
    zoo_sql = str(tiny_zoo.draft_dir("sql"))
    status, replies = run_canary(service, client, tiny_zoo, negated_draft(zoo_sql, tmp_path / "neg"), "negated",
                                 draft="sql")
    assert status.state == "rolled back" and status.canary.alpha < 0.2 < status.base.alpha, status
    assert {reply.stats.draft for _, reply in replies} == {"sql", "sql@negated"}
    assert all(drafts == {"sql": zoo_sql} for drafts in sources(client, "sql")), sources(client, "sql")
    better = shutil.copytree(zoo_sql, tmp_path / "v2")
    try:
        status, more = run_canary(service, client, tiny_zoo, better, "v2", draft="sql", decision="promote")
        assert status.state == "promoted" and "by an operator" in status.reason, status
        assert all(drafts == {"sql": str(better)} for drafts in sources(client, "sql")), sources(client, "sql")
        check_lossless(client, replies + more)
    finally:
        control.swap_draft.remote("sql", zoo_sql).result(timeout_s=120)  # the other tests' draft
    assert all(drafts == {"sql": zoo_sql} for drafts in sources(client, "sql"))
