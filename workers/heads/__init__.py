"""Draft heads fed by the target: EAGLE-3 (Li et al., 2025) in vLLM's speculators format.

    eagle3.py    the head: one decoder layer over the target's fused hidden states, its own KV cache
    format.py    its config and weights, read and written in the speculators format
    proposer.py  a head as a request's proposer (workers/proposing.py)

Training a head (``specserve distill --method eagle3``) is the training layer's: cluster/zoo/head_training.py.
"""
