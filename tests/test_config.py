"""The Serve config file: valid for Ray Serve's own schema, and for ours; typos are refused."""

import json
import re

import pytest
from pydantic import ValidationError

from specserve.cluster.bringup import default_config_path, serve_config
from specserve.cluster.config import ServiceConfig
from specserve.cluster.models import resolve_models
from specserve.cluster.placement import actor_options


def test_the_deployed_file_parses_with_serves_schema_and_ours():
    from ray.serve.schema import ServeDeploySchema

    doc = serve_config(default_config_path())
    ServeDeploySchema.model_validate(doc)
    config = ServiceConfig.model_validate(doc["applications"][0]["args"])
    assert config.target.cpus == (0,) and config.draft_pool.cpus == (1,) and config.router.port == 50051


def test_port_and_overrides_apply_to_the_args():
    doc = serve_config(default_config_path(), port=0, overrides={"router": {"max_concurrent_requests": 3}})
    config = ServiceConfig.model_validate(doc["applications"][0]["args"])
    assert config.router.port == 0 and config.router.max_concurrent_requests == 3
    assert config.draft_pool.workers == 2  # untouched keys keep the file's values
    assert config.router.http_port == 0  # port 0 means any free port for both APIs
    for http_port in (None, 8123):  # unless the overrides say otherwise
        doc = serve_config(default_config_path(), port=0, overrides={"router": {"http_port": http_port}})
        assert ServiceConfig.model_validate(doc["applications"][0]["args"]).router.http_port == http_port
    file_port = serve_config(default_config_path())["applications"][0]["args"]["router"]["http_port"]
    assert file_port == 8000


@pytest.mark.parametrize("args, message", [
    ({"router": {"prot": 1}}, "prot"),
    ({"router": {"port": 70000}}, "less than or equal to 65535"),
    ({"draft_pool": {"workers": 0}}, "greater than or equal to 1"),
    ({"target": {"device": "tpu"}}, "pattern"),
    ({"models": {"zoo": None}}, "give a zoo, or a target"),
    ({"draft_pool": {"session_idle_seconds": 40}}, r"draft_pool.session_idle_seconds \(40\) must exceed "
                                                    r"router.timeouts.target_wait_seconds \+ target_full_wait_seconds \(40\)"),
    ({"target": {"session_idle_seconds": 12}}, r"target.session_idle_seconds \(12\) must exceed"),
    ({"router": {"tree_max_tokens": 64}, "target": {"batching": {"max_tokens_per_pass": 64}}},
     r"router.tree_max_tokens \(64\) needs target.batching.max_tokens_per_pass of at least 96"),
])
def test_bad_config_is_refused_with_the_key(args, message):
    with pytest.raises(ValidationError, match=message):
        ServiceConfig.model_validate(args)


def test_task_table_must_name_known_drafts(tiny_zoo):
    config = ServiceConfig.model_validate({"models": {"zoo": str(tiny_zoo.root)}, "router": {"tasks": {"sql": ["nope"]}}})
    with pytest.raises(ValueError, match=r"router.tasks\['sql'\] names drafts \['nope'\]"):
        resolve_models(config.models, config.router)


def test_zoo_models_resolve_with_a_general_task(tiny_zoo):
    config = ServiceConfig.model_validate({"models": {"zoo": str(tiny_zoo.root)}})
    models = resolve_models(config.models, config.router)
    assert set(models.drafts) == set(tiny_zoo.draft_names)
    assert models.tasks["sql"][0] == "sql" and models.tasks["general"] == ("general", "ngram", "suffix")
    assert models.trees["general"] == ("general", "ngram", "suffix")  # its draft first; asked for, not offered
    assert models.priors["sql"]["sql"] == tiny_zoo.manifest["acceptance"]["sql"]["sql"]  # the policy's start
    assert "tree" not in models.priors["sql"]  # measured as it is served
    assert set(models.proposers) == {*tiny_zoo.draft_names, "ngram", "suffix", "tree", "cascade"}


def test_a_tasks_cascade_runs_its_first_draft_model_and_is_offered_as_configured(tiny_zoo):
    """``cascade``: a task's first draft model (never heads, which draft in passes of their own)
    with prompt lookup under it; asked for by name always, offered to AUTO with router.cascades."""
    zoo = {"zoo": str(tiny_zoo.root)}
    models = resolve_models(*_parts({"models": zoo}))
    assert models.cascades["sql"] == "sql" and models.cascades["general"] == "general"
    assert all("cascade" not in names for names in models.tasks.values())  # asked for, not offered
    models = resolve_models(*_parts({"models": zoo, "router": {"cascades": True}}))
    assert models.tasks["sql"] == ("sql", "general", "eagle3", "ngram", "suffix", "cascade")
    assert "cascade" not in models.priors["sql"]  # measured as it is served
    models = resolve_models(*_parts({"models": zoo, "router": {"tasks": {"sql": ["eagle3", "general", "cascade"],
                                                                         "general": ["general"]}}}))
    assert models.cascades["sql"] == "general"  # the task's first draft model, past the head
    with pytest.raises(ValueError, match="names 'cascade', which needs a draft model"):
        resolve_models(*_parts({"models": zoo, "router": {"tasks": {"sql": ["eagle3", "cascade"],
                                                                    "general": ["general"]}}}))
    with pytest.raises(ValidationError, match="cascade_guesses"):
        ServiceConfig.model_validate({"router": {"cascade_guesses": 16}})


def test_draft_free_proposers_are_offered_as_configured_and_their_names_reserved(tiny_zoo):
    zoo = {"zoo": str(tiny_zoo.root)}
    models = resolve_models(*_parts({"models": zoo, "router": {"draft_free": ["suffix"], "trees": True}}))
    assert models.tasks["sql"] == ("sql", "general", "eagle3", "suffix", "tree") and "tree" in models.proposers
    # An operator's table gets the draft-free proposers beside its drafts, unless a task is taken as written.
    models = resolve_models(*_parts({"models": zoo, "router": {"tasks": {"sql": ["ngram", "sql"], "general": ["general"]}}}))
    assert models.tasks == {"sql": ("ngram", "sql", "suffix"), "general": ("general", "ngram", "suffix")}
    models = resolve_models(*_parts({"models": zoo, "router": {"tasks": {"sql": ["ngram", "sql"], "general": ["general"]},
                                                                "as_written": ["sql", "general"]}}))
    assert models.tasks == {"sql": ("ngram", "sql"), "general": ("general",)}
    with pytest.raises(ValueError, match=r"router.as_written names tasks \['db'\]"):
        resolve_models(*_parts({"models": zoo, "router": {"tasks": {"sql": ["sql"]}, "as_written": ["db"]}}))
    assert set(models.proposers) == {*tiny_zoo.draft_names, "ngram", "suffix", "tree", "cascade"}  # a client may ask for any
    models = resolve_models(*_parts({"models": zoo, "router": {"tasks": {"sql": ["sql", "tree"], "general": ["general"]}}}))
    assert models.trees["sql"] == ("sql", "ngram", "suffix") and models.tasks["sql"] == ("sql", "tree", "ngram", "suffix")
    with pytest.raises(ValueError, match="names 'tree', which needs a draft"):
        resolve_models(*_parts({"models": zoo, "router": {"tasks": {"sql": ["tree"], "general": ["general"]}}}))
    with pytest.raises(ValueError, match="which router.draft_free does not offer"):
        resolve_models(*_parts({"models": zoo, "router": {"draft_free": [], "tasks": {"sql": ["ngram"]}}}))
    with pytest.raises(ValueError, match="draft-free proposers are ngram, suffix"):
        ServiceConfig.model_validate({"router": {"draft_free": ["ngrams"]}})
    with pytest.raises(ValueError, match=r"draft names \['suffix'\] are reserved"):
        resolve_models(*_parts({"models": zoo | {"drafts": {"suffix": "x"}}}))


def _parts(doc: dict):
    config = ServiceConfig.model_validate(doc)
    return config.models, config.router


def test_a_validate_profile_is_the_policys_start_over_the_zoos(tiny_zoo, tmp_path):
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps({"sql": {"general": 0.5}, "poor": {"code": 1}}))
    router = {"tasks": {"sql": ["sql", "general"], "general": ["general"], "poor": ["code"]}}
    models = resolve_models(*_parts({"models": {"zoo": str(tiny_zoo.root), "priors": str(profile)}, "router": router}))
    assert models.priors["sql"] == {**tiny_zoo.manifest["acceptance"]["sql"], "general": 0.5}
    assert models.priors["poor"] == {"code": 1.0}  # a task of the operator's table, not the zoo's
    own = {"zoo": None, "target": "t", "drafts": {"mine": "d"}, "priors": str(profile)}
    profile.write_text(json.dumps({"general": {"mine": 0.25}}))
    assert resolve_models(*_parts({"models": own, "router": {"tasks": {"general": ["mine"]}}})).priors == {
        "general": {"mine": 0.25}}  # your own models: the profile alone (no zoo measured them)


@pytest.mark.parametrize("content, message", [
    (None, "no such file; write a profile with `specserve validate --profile FILE`"),
    ("{", "not a readable JSON profile"),
    ('["sql"]', "expected a JSON object {task: {draft: acceptance}}"),
    ('{"poetry": {"sql": 0.5}}', "unknown task 'poetry'; these models' tasks: code, general, math, prose, sql"),
    ('{"sql": {"nope": 0.5}}', "task 'sql' names unknown draft 'nope'"),
    ('{"sql": {"ngram": 0.5}}', "the draft-free proposers take no prior"),
    ('{"sql": {"sql": 1.5}}', "the acceptance of draft 'sql' on task 'sql' must be a number in [0, 1], got 1.5"),
    ('{"sql": {"sql": "0.5"}}', "must be a number in [0, 1], got '0.5'"),
    ('{"sql": {"sql": true}}', "must be a number in [0, 1], got True"),
    ('{"sql": {"sql": NaN}}', "must be a number in [0, 1], got nan"),
])
def test_a_bad_profile_is_refused_with_what_is_wrong(tiny_zoo, tmp_path, content, message):
    profile = tmp_path / "profile.json"
    if content is not None:
        profile.write_text(content)
    with pytest.raises(ValueError, match=re.escape(message)):
        resolve_models(*_parts({"models": {"zoo": str(tiny_zoo.root), "priors": str(profile)}}))


def node(alive: bool = True, **resources: float) -> dict:
    """A node as ray.nodes() lists it."""
    return {"Alive": alive, "Resources": resources}


def test_each_process_takes_its_kinds_device_and_a_gpu_when_the_nodes_of_its_kind_have_them():
    from specserve.cluster.placement import on_gpu

    config = ServiceConfig()
    assert actor_options(config.target, gpu=False) == {"num_cpus": 0, "resources": {"specserve_target_device": 1}}
    assert actor_options(config.target, gpu=True) == {
        "num_cpus": 0, "num_gpus": 1.0, "resources": {"specserve_target_device": 1}}
    gpu_targets_cpu_drafts = [node(specserve_target_device=1, GPU=1), node(specserve_draft_device=2, CPU=4)]
    assert on_gpu(config.target, gpu_targets_cpu_drafts) and not on_gpu(config.draft_pool, gpu_targets_cpu_drafts)
    assert not on_gpu(config.target, [node(alive=False, specserve_target_device=1, GPU=1)])  # a dead node
    assert on_gpu(ServiceConfig.model_validate({"draft_pool": {"device": "gpu"}}).draft_pool, [])


def test_auto_waits_for_a_node_of_its_kind_before_deciding(monkeypatch):
    from specserve.cluster import placement

    joined = iter([[node(specserve_router_node=1)], [node(specserve_router_node=1)],
                   [node(specserve_router_node=1), node(specserve_target_device=1, GPU=1)]])
    monkeypatch.setattr(placement.ray, "nodes", lambda: next(joined))
    monkeypatch.setattr(placement, "NODE_POLL_SECONDS", 0.0)
    assert placement.place(ServiceConfig().target)["num_gpus"] == 1.0  # the GPU node joined third
    monkeypatch.setattr(placement.ray, "nodes", lambda: [node(specserve_router_node=1)])
    with pytest.raises(ValueError, match="no node advertising 'specserve_target_device' joined within 0 s"):
        placement.place(ServiceConfig().target, timeout=0.0)


def test_the_embedded_cluster_has_as_many_simulated_devices_as_the_config_asks_for():
    """Simulated devices stand for no hardware: a fleet of them runs on one machine. Real ones stay
    one target device and two draft devices, and more is refused as before."""
    from specserve.cluster.placement import check_devices, embedded_resources, local_resources

    sim = {"device": "sim"}
    fleet = ServiceConfig.model_validate({"target": sim | {"replicas": 4}, "draft_pool": sim | {"workers": 8}})
    assert embedded_resources(fleet) == local_resources(4, 8)
    check_devices(fleet, [node(**embedded_resources(fleet))], embedded=True)
    scaling = ServiceConfig.model_validate({"target": sim | {"autoscaling": {"min_replicas": 1, "max_replicas": 6}}})
    assert embedded_resources(scaling) == local_resources(6, 2)
    real = ServiceConfig.model_validate({"target": {"replicas": 4}})
    assert embedded_resources(real) == local_resources()
    with pytest.raises(ValueError, match="target.replicas=4 needs 4 'specserve_target_device' but the embedded"):
        check_devices(real, [node(**embedded_resources(real))], embedded=True)


def test_a_cluster_without_the_devices_is_refused_before_deploying():
    from specserve.cluster.placement import check_devices, local_resources

    config = ServiceConfig()
    check_devices(config, [node(**local_resources())])  # the embedded cluster's: fits
    with pytest.raises(ValueError, match="draft_pool.workers=2 needs 2 'specserve_draft_device' but the cluster has 1"):
        check_devices(config, [node(specserve_target_device=1, specserve_draft_device=1)])
    with pytest.raises(ValueError, match="target.replicas=1 needs 1 'specserve_target_device' but the cluster has 0"):
        check_devices(config, [node(CPU=8)])
    head = node(specserve_target_device=1, specserve_router_node=1, GPU=1)
    check_devices(config, [head, node(specserve_draft_device=2, GPU=2)])  # one target and two drafts, a GPU each
    check_devices(config, [head, node(specserve_draft_device=2)])  # drafts on a CPU node
    with pytest.raises(ValueError, match="draft_pool.workers=2 needs 2 'GPU' but the cluster has 1 left: start nodes "
                                         "with GPUs"):
        check_devices(config, [head, node(specserve_draft_device=2, GPU=1)])
    with pytest.raises(ValueError, match="the router needs a node with the custom resource 'specserve_router_node'"):
        check_devices(config, [node(specserve_target_device=1, specserve_draft_device=2)])
    anywhere = ServiceConfig.model_validate({"router": {"node_resource": None}})
    check_devices(anywhere, [node(specserve_target_device=1, specserve_draft_device=2)])


def test_hub_ids_reach_the_loader_as_given():
    """Production sources are hub ids or mounted directories; a hub id is not mistaken for a path, so
    the loader may fetch it (a directory never goes to the hub). test_multinode serves a directory."""
    from specserve.workers.loading import _is_local

    config = ServiceConfig.model_validate({"models": {"zoo": None, "target": "acme/target-8b",
                                                      "drafts": {"code": "acme/draft-code"}},
                                           "router": {"default_task": "code"}})
    models = resolve_models(config.models, config.router)
    assert (models.target, models.drafts, models.tasks) == ("acme/target-8b", {"code": "acme/draft-code"},
                                                            {"code": ("code", "ngram", "suffix")})
    assert not _is_local(models.target)


def test_several_routers_share_one_port_picked_before_they_start():
    from specserve.cluster.bringup import pin_shared_ports

    args = {"router": {"replicas": 2, "port": 0, "http_port": 0}}
    pin_shared_ports(args)
    assert args["router"]["port"] > 0 and args["router"]["http_port"] > 0  # one number for every process
    alone = {"router": {"port": 0, "http_port": None}}
    pin_shared_ports(alone)
    assert alone == {"router": {"port": 0, "http_port": None}}  # one router: the OS picks as it binds
