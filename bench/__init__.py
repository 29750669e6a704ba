"""`specserve bench`: speed, acceptance, overhead, a peer and load, measured side by side in one run.

    run.py       the sections, in order, against one service and one in-process engine
    prompts.py   the held-out prompts (bench/prompts/) and the check that no zoo trained on them
    decoders.py  one greedy or sampled decode through the service, the engine or HF assisted generation
    load.py      concurrent clients, streaming, for throughput, latency and time to first token
    memory.py    resident memory of each component's processes
    figures.py   everything the report says, derived from the raw samples alone (pure)
    report.py    report.md and the printed summary; plots.py: the PNGs
"""
