"""In-process A/B: each task's draft with and without a cascade (prompt lookup, 4 guesses), target-only
alongside, alternating prompt by prompt on the same engine (demo zoo, greedy, k=4, 64 tokens)."""
import time, json
from specserve.cluster.local import open_zoo, zoo_engine
from specserve.workers.request import GenerationParams
zoo = open_zoo("demo")
engine = zoo_engine(zoo, zoo.draft_names)
rows = {}
for task in zoo.tasks:
    draft = zoo.default_draft(task)
    t = {"off": 0.0, "draft": 0.0, "cascade": 0.0, "ngram": 0.0}; ids = {}
    passes = {"draft": 0, "cascade": 0}; same = True
    for prompt in zoo.prompts(task)[:6]:
        for path in ("off", "draft", "cascade", "ngram"):
            engine.cascade = 4 if path == "cascade" else 0
            start = time.perf_counter()
            done = engine.generate(prompt, GenerationParams(max_tokens=64, k=4, speculation=path != "off"),
                                   draft=None if path == "off" else "ngram" if path == "ngram" else draft).complete()
            t[path] += time.perf_counter() - start
            ids[path] = done.token_ids
            if path in ("draft", "cascade"):
                passes[path] += done.stats.drafted and round(done.stats.draft_seconds * 1e6)
        same &= ids["off"] == ids["draft"] == ids["cascade"] == ids["ngram"]
    rows[task] = {"draft": draft, "draft_x": round(t["off"] / t["draft"], 3), "cascade_x": round(t["off"] / t["cascade"], 3), "ngram_x": round(t["off"] / t["ngram"], 3),
                  "draft_us": passes["draft"], "cascade_us": passes["cascade"], "identical": same}
    print(task, rows[task], flush=True)
print(json.dumps(rows))
