"""The documents of packed rows (data.document_mask): a pure function of the tokens, which the train
and eval steps apply on the device to the batch they already hold. Imports no input pipeline, so a
step builds where grain and TFDS are not installed (a GPU machine fed synthetic tokens)."""
import jax
import jax.numpy as jnp


def document_segments(tokens_BT, eot_id: int):
    """(segment_ids_BT, positions_BT), int32, of rows of documents packed end to end: a document
    starts after each <|endoftext|> (the token ends its own document), the row's first tokens are
    document 0 and each document's positions count from 0. A function of the tokens alone, so the
    steps derive it on the device from the batch they already hold (data.document_mask)."""
    tokens_BT = jnp.asarray(tokens_BT)
    T = tokens_BT.shape[1]
    ends_BT = (tokens_BT == eot_id).astype(jnp.int32)
    starts_BT = jnp.pad(ends_BT[:, :-1], ((0, 0), (1, 0)))  # token t starts a document after an EOT at t - 1
    segment_ids_BT = jnp.cumsum(starts_BT, axis=1, dtype=jnp.int32)
    index_BT = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), tokens_BT.shape)
    first_BT = jax.lax.cummax(jnp.where(starts_BT == 1, index_BT, 0), axis=1)
    return segment_ids_BT, index_BT - first_BT
