"""The case labels bench/torch_reference.py prints and scripts/bench/hopper_targets.py looks up: one
spelling for both, so that a renamed case cannot turn a target row into "not measured"."""


def prefill_label(backend, head_dim, batch, length, causal, heads=32, kv_heads=8):
    """Heads other than Llama-3-8B's 32/8 appear in the label ("hd64 h24kv4")."""
    shape = f"hd{head_dim}" + ("" if (heads, kv_heads) == (32, 8) else f" h{heads}kv{kv_heads}")
    return f"torch-{backend} prefill {shape} B{batch} L{length} causal{int(causal)}"


def decode_label(backend, head_dim, heads, kv_heads, batch, length):
    return f"torch-{backend} decode hd{head_dim} h{heads}kv{kv_heads} B{batch} L{length}"
