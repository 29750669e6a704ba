"""The zoo builds end to end (corpora, tokenizer, target training, distillation, evaluation),
is cached, resumes after an interruption, is deterministic, and its distillation runs on its own."""

import json
import math
import subprocess
import sys

import pytest
import torch

from specserve.workers.loading import load_tokenizer
from specserve.workers.tokenizer_check import check_compatible
from specserve.cluster.zoo.build import build_zoo
from specserve.cluster.zoo.corpora import TASKS
from specserve.cluster.zoo.distill import distill_to_directory
from specserve.cluster.zoo.presets import TrainBudget, get_preset
from specserve.cluster.zoo.zoo import Zoo


def test_manifest_describes_the_zoo(tiny_zoo):
    m = tiny_zoo.manifest
    assert m["preset"] == "tiny" and m["tasks"] == list(TASKS)
    assert set(m["drafts"]) == {*TASKS, "general", "eagle3"} and m["drafts"]["eagle3"]["method"] == "eagle3"
    assert all(names[-1] == "eagle3" for names in m["task_drafts"].values())  # after the zoo's own drafts
    assert m["target"]["parameters"] > max(d["parameters"] for d in m["drafts"].values())
    for task in TASKS:
        assert math.isfinite(m["target"]["perplexity"][task]) and m["target"]["perplexity"][task] > 1
        assert set(m["acceptance"][task]) == set(m["drafts"])  # the task x draft matrix
        assert all(0.0 <= a <= 1.0 for a in m["acceptance"][task].values())
        assert tiny_zoo.prompts(task)
    assert (tiny_zoo.target_dir / "config.json").exists()  # an ordinary HF model directory


def test_held_out_documents_are_never_trained_on(tiny_zoo):
    for task in TASKS:
        corpus = json.loads((tiny_zoo.root / "corpora" / f"{task}.json").read_text())
        assert corpus["held_out"] and not set(corpus["held_out"]) & set(corpus["train"])
        assert all(any(doc.startswith(p) for doc in corpus["held_out"]) for p in tiny_zoo.prompts(task))


def test_a_second_build_returns_the_cached_zoo(tiny_zoo):
    before = (tiny_zoo.root / "manifest.json").stat().st_mtime_ns
    again = build_zoo(get_preset("tiny"), tiny_zoo.root)
    assert again.manifest == tiny_zoo.manifest
    assert (tiny_zoo.root / "manifest.json").stat().st_mtime_ns == before


def test_an_interrupted_build_resumes_and_is_deterministic(tiny_zoo, tmp_path):
    # A copy of the zoo that lost its last draft and manifest mid-write, as if killed.
    import shutil

    copy = tmp_path / "zoo"
    shutil.copytree(tiny_zoo.root, copy)
    shutil.rmtree(copy / "drafts" / "general")
    (copy / "manifest.json").unlink()
    (copy / "drafts" / "general.partial").mkdir()  # half-written stage left behind
    target_mtime = (copy / "target" / "model.safetensors").stat().st_mtime_ns
    resumed = build_zoo(get_preset("tiny"), copy)
    assert (copy / "target" / "model.safetensors").stat().st_mtime_ns == target_mtime  # not retrained
    assert not (copy / "drafts" / "general.partial").exists()
    # Rebuilt from the same seed, the general draft is bit-identical, so is everything measured from it.
    assert (copy / "drafts" / "general" / "model.safetensors").read_bytes() == \
        (tiny_zoo.root / "drafts" / "general" / "model.safetensors").read_bytes()
    assert resumed.manifest["acceptance"] == tiny_zoo.manifest["acceptance"]


def test_distill_on_user_text_makes_a_compatible_draft(tiny_zoo, tmp_path):
    corpus = tmp_path / "queries.sql"
    corpus.write_text("\n".join(json.loads((tiny_zoo.root / "corpora" / "sql.json").read_text())["train"][:40]))
    out = tmp_path / "my-draft"
    facts = distill_to_directory(str(tiny_zoo.target_dir), "sql", [str(corpus)], str(out),
                                 budget=TrainBudget(steps=5, batch_size=4, learning_rate=3e-3), distill_tokens=2_000, seed=0,
                                 init="fresh")
    assert facts["task"] == "sql" and facts["parameters"] > 0 and math.isfinite(facts["final_loss"])
    assert facts["init"] == "fresh" and 0 <= facts["held_out_alpha"] <= 1 and facts["cost_ratio"] > 0
    check_compatible(load_tokenizer(str(tiny_zoo.target_dir)), load_tokenizer(str(out)))
    assert json.loads((out / "specserve_draft.json").read_text()) == facts


def test_zoo_open_refuses_an_incomplete_directory(tmp_path):
    import pytest

    with pytest.raises(FileNotFoundError, match="no complete zoo"):
        Zoo.open(tmp_path)


def test_an_early_exit_of_the_target_starts_as_its_first_layers_with_its_vocabulary_frozen(tiny_engine):
    from specserve.cluster.zoo.distill import draft_from_target

    target = tiny_engine.target
    draft = draft_from_target(target, layers=1)
    assert draft.config.num_hidden_layers == 1 and draft.config.hidden_size == target.config.hidden_size
    assert torch.equal(draft.get_input_embeddings().weight, target.get_input_embeddings().weight)
    assert torch.equal(draft.model.layers[0].mlp.up_proj.weight, target.model.layers[0].mlp.up_proj.weight)
    assert not draft.get_output_embeddings().weight.requires_grad and draft.model.layers[0].mlp.up_proj.weight.requires_grad


def test_a_specialized_task_draft_starts_from_the_general_draft(tiny_zoo, tmp_path, monkeypatch):
    """With ``specialize_general`` a task draft starts as the general draft, then trains on its task's
    data (the demo zoo's task drafts beat the general one on their tasks so); without, from scratch.
    Training is left out here, to see where each starts."""
    import dataclasses
    import shutil

    from transformers import AutoModelForCausalLM

    from specserve.cluster.zoo import build

    monkeypatch.setattr(build, "distill_draft", lambda model, *args, **kwargs: 0.0)
    shutil.copytree(tiny_zoo.draft_dir("general"), tmp_path / "drafts" / "general")
    tokenizer = load_tokenizer(str(tiny_zoo.draft_dir("general")))
    data = {"sql": build.DistillSet.load(tiny_zoo.root / "distill" / "sql.safetensors")}
    weights = lambda model: torch.nn.utils.parameters_to_vector(model.parameters())  # noqa: E731
    general = weights(AutoModelForCausalLM.from_pretrained(tiny_zoo.draft_dir("general")))

    def start(specialize: bool, out) -> torch.Tensor:
        preset = dataclasses.replace(get_preset("tiny"), specialize_general=specialize)
        return weights(build._draft(out, preset, tokenizer, data, "sql"))

    assert torch.equal(start(True, tmp_path), general)
    assert not torch.equal(start(False, tmp_path / "scratch"), general)


def test_a_zoo_built_before_a_setting_existed_is_used_as_built(tiny_zoo, tmp_path):
    """A complete zoo whose build record lacks a setting added since (specialize_general) is what
    that setting's old behaviour built: used as built, with a warning; a partial one is refused."""
    import dataclasses
    import shutil

    from specserve.cluster.zoo.build import BUILD_CONFIG, MANIFEST, _claim

    out = tmp_path / "zoo"
    shutil.copytree(tiny_zoo.root, out)
    record = json.loads((out / BUILD_CONFIG).read_text())
    del record["specialize_general"]
    (out / BUILD_CONFIG).write_text(json.dumps(record))
    now = dataclasses.replace(get_preset("tiny"), specialize_general=True)
    _claim(out, get_preset("tiny"))  # the old behaviour: the same zoo
    _claim(out, now)  # complete: used as built
    (out / MANIFEST).unlink()
    with pytest.raises(ValueError, match="built with other settings"):
        _claim(out, now)


def test_serving_processes_import_no_zoo_building_module():
    """The router, a target replica and a draft worker read a built zoo (cluster/zoo/zoo.py) and
    import nothing that builds one (the corpora, training, presets): judged in a fresh process."""
    from specserve.cluster.zoo.presets import PRESETS
    from specserve.cluster.zoo.zoo import PRESET_NAMES

    assert tuple(PRESETS) == PRESET_NAMES  # what a serving process knows of the presets: their names
    code = ("import sys, specserve.cluster.ingress, specserve.workers.target_replica, specserve.workers.draft_worker; "
            "print(' '.join(sorted(m for m in sys.modules if m.startswith('specserve.cluster.zoo.'))))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["specserve.cluster.zoo.zoo"]
