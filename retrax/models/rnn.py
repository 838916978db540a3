"""RNN models: `RNNLM`, `GRULM` and `LSTMSeq2SeqAttn`."""

from retrax import layers as tl
from retrax.fastmath import numpy as jnp
from retrax.models import registry
from retrax.validation import ArgumentValueError


@registry.register
def RNNLM(vocab_size, d_model=512, n_layers=2, rnn_cell=tl.LSTMCell,
          rnn_cell_d_state_multiplier=2, dropout=0.1, mode='train'):
  """RNN language model: token ids `(batch, length)` to logits `(batch, length, vocab_size)`.

  `ShiftRight`, `Embedding`, `Dropout`, then `n_layers` stacked cells under
  one `Scan` over the sequence (their states concatenated in one carry of
  depth `n_layers * rnn_cell_d_state_multiplier * d_model`), then a `Dense`
  to logits (no log-softmax), as in Trax.

  Args:
    vocab_size: Number of token ids (inputs lie in `range(vocab_size)`).
    d_model: Depth of embeddings and of each cell's output.
    n_layers: Number of cells; Trax supports only 2.
    rnn_cell: Cell constructor taking `n_units=` (`LSTMCell`, `GRUCell`).
    rnn_cell_d_state_multiplier: State depth of a cell divided by `d_model`
      (2 for LSTM, 1 for GRU).
    dropout: Dropout rate after the embedding (train mode).
    mode: 'train', 'eval' or 'predict' (the state is kept between calls
      and the input is not shifted, for decoding one token at a time).

  Returns:
    The model as a `Serial` layer.
  """
  if n_layers != 2:
    raise ArgumentValueError(f'Number of layers must be set to 2; instead got '
                             f'{n_layers}.')

  def MultiRNNCell():
    """`n_layers` cells run in series on one time step; states concatenated."""
    return tl.Serial(
        tl.Parallel([], tl.Split(n_items=n_layers)),
        tl.SerialWithSideOutputs(
            [rnn_cell(n_units=d_model) for _ in range(n_layers)]),
        tl.Parallel([], tl.Concatenate(n_items=n_layers)),
    )

  zero_state = tl.MakeZeroState(
      depth_multiplier=n_layers * rnn_cell_d_state_multiplier)
  return tl.Serial(
      tl.ShiftRight(mode=mode),
      tl.Embedding(vocab_size, d_model),
      tl.Dropout(rate=dropout, mode=mode),
      tl.Branch([], zero_state),
      tl.Scan(MultiRNNCell(), axis=1, mode=mode),
      tl.Select([0], n_in=2),  # Drops the RNN state.
      tl.Dense(vocab_size),
  )


@registry.register
def GRULM(vocab_size=256, d_model=512, n_layers=1, mode='train'):
  """GRU language model: `ShiftRight`, `Embedding`, `n_layers` x `GRU`, `Dense` (logits).

  Args:
    vocab_size: Number of token ids.
    d_model: Depth of embeddings and GRU states.
    n_layers: Number of GRU layers.
    mode: 'train', 'eval' or 'predict' (state kept between calls, no shift).

  Returns:
    The model as a `Serial` layer mapping `(batch, length)` ids to
    `(batch, length, vocab_size)` logits.
  """
  return tl.Serial(
      tl.ShiftRight(mode=mode),
      tl.Embedding(vocab_size, d_model),
      [tl.GRU(d_model, mode=mode) for _ in range(n_layers)],
      tl.Dense(vocab_size),
  )


def _PrepareAttentionInputs():
  """(encoder, decoder activations, source ids) -> (q, k, v, mask)."""
  def f(encoder_activations, decoder_activations, input_tokens):
    keys = values = encoder_activations
    queries = decoder_activations
    mask = input_tokens != 0  # 1 at real source tokens, 0 at padding.
    mask = jnp.reshape(mask, (mask.shape[0], 1, 1, mask.shape[1]))
    mask = jnp.broadcast_to(mask, (mask.shape[0], 1,
                                   decoder_activations.shape[1], mask.shape[3]))
    return queries, keys, values, mask.astype(jnp.float32)
  return tl.Fn('PrepareAttentionInputs', f, n_out=4)


@registry.register
def LSTMSeq2SeqAttn(input_vocab_size=256, target_vocab_size=256,
                    d_model=512, n_encoder_layers=2, n_decoder_layers=2,
                    n_attention_heads=1, attention_dropout=0.0, mode='train'):
  """LSTM encoder-decoder with attention: `(source, target)` ids to log-probs.

  The encoder (`Embedding`, `n_encoder_layers` LSTMs) gives keys and values;
  the pre-attention decoder (`ShiftRight`, `Embedding`, LSTM) gives queries;
  `AttentionQKV` (masking source padding, id 0) is added residually, then
  `n_decoder_layers` LSTMs, `Dense(target_vocab_size)` and `LogSoftmax`.
  Outputs `(log_probs, target)`: `(batch, target_length, target_vocab_size)`
  and the target ids, as in Trax.

  Args:
    input_vocab_size: Number of source token ids.
    target_vocab_size: Number of target token ids.
    d_model: Depth of embeddings, LSTMs and attention.
    n_encoder_layers: LSTMs in the encoder.
    n_decoder_layers: LSTMs in the decoder after attention.
    n_attention_heads: Attention heads.
    attention_dropout: Dropout rate in attention (train mode).
    mode: 'train', 'eval' or 'predict' (keys/values cached in predict).

  Returns:
    The model as a `Serial` layer.
  """
  input_encoder = tl.Serial(
      tl.Embedding(input_vocab_size, d_model),
      [tl.LSTM(d_model) for _ in range(n_encoder_layers)],
  )
  pre_attention_decoder = tl.Serial(
      tl.ShiftRight(mode=mode),
      tl.Embedding(target_vocab_size, d_model),
      tl.LSTM(d_model, mode=mode),
  )
  return tl.Serial(                # in-toks, target-toks
      tl.Select([0, 1, 0, 1]),     # in-toks, target-toks, in-toks, target-toks
      tl.Parallel(input_encoder, pre_attention_decoder),
      _PrepareAttentionInputs(),   # q, k, v, mask, target-toks
      tl.Residual(
          tl.AttentionQKV(d_model, n_heads=n_attention_heads,
                          dropout=attention_dropout, mode=mode,
                          cache_KV_in_predict=True)
      ),                           # decoder-vecs, mask, target-toks
      tl.Select([0, 2]),           # decoder-vecs, target-toks
      [tl.LSTM(d_model, mode=mode) for _ in range(n_decoder_layers)],
      tl.Dense(target_vocab_size),
      tl.LogSoftmax(),
  )
