"""Narrow measurements outside `specserve bench`, each answering one question a design choice rests on.

Each runs as ``python -m specserve.bench.experiments.<name>``; README.md says what each answers,
the answer it gave and where that is recorded; tests/test_experiments.py runs each once on the tiny
zoo.

    batched_pass    one pass over many sessions: packed over pool regions, gathered, padded, one by one
    k_sweep         greedy speedup through the service at each fixed k
    step_overhead   what a worker's scheduler adds to a draft step beyond its device time
    stream_floor    what one message on a grpc.aio stream costs the server
    router_ceiling  what one router process sustains, alone on its core (uses stream_floor's CPU reading)
    single_stream   one target-only stream on a real model, against llama.cpp
"""
