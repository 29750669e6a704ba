"""`specserve bench`: speed, acceptance, overhead, a peer and load, measured side by side in one run.

    cli.py       the `specserve bench` command, registered through the specserve.commands entry point
    settings.py  what a run measures, and the goals it is judged against (defaults defined once)
    run.py       the sections, in order, against one service and one in-process engine
    prompts.py   the held-out prompts (bench/prompts/) and the check that no zoo trained on them
    decoders.py  one decode through the service, the in-process engine or HF assisted generation
    load/        concurrent streaming clients, for throughput, latency and time to first token, and the
                 workers' batch counters; ``python -m specserve.bench.load`` runs the load section alone
    peers.py     the load section's peers: transformers static batch and generate_batch, pinned like the target
    memory.py    resident memory of each component's processes
    samples.py   one measured decode: the raw record saved in results.json
    figures.py   everything the report says, derived from the samples alone (pure; load_figures.py: load's)
    report.py    report.md and the printed summary; plots.py: the PNGs

Narrower studies, each a question and its answer, are in experiments/ (its README).
"""
