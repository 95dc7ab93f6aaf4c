"""The case labels bench/torch_reference.py prints and tools/hopper_targets.py looks up: one
spelling for both, so that a renamed case cannot turn a target row into "not measured"."""


def prefill_label(backend, head_dim, batch, length, causal):
    return f"torch-{backend} prefill hd{head_dim} B{batch} L{length} causal{int(causal)}"


def decode_label(backend, head_dim, heads, kv_heads, batch, length):
    return f"torch-{backend} decode hd{head_dim} h{heads}kv{kv_heads} B{batch} L{length}"
