"""Decoding with Trax models: sampling and beam search, compiled whole under `jax.jit`.

The model is built with `mode='predict'`: its layers keep fixed-size caches
(keys and values, position counters, LSH buckets) in `model.state`, and each
step feeds one token. `autoregressive_sample` and `beam_search` compile the
whole decoding of a batch into one XLA program (a `lax.while_loop` over
positions: one dispatch per call, compiled once per model and shapes);
`autoregressive_sample_stream` runs one compiled step per token. A first
step that changes the state's structure (`tl.Cache` storing an encoder's
outputs) runs in a program of its own, so the loops see the structure a
decoded state keeps: decoding again, with `model.state` reset or not,
compiles nothing new.

Fed tokens, one per step: the start symbol, then the prefix (for a language
model `inputs` then `prompt`; for an encoder-decoder, whose `inputs` go to the
encoder, `prompt`), then the samples. Results hold only generated tokens.
Decoding starts from the current `model.state`; as in Trax, sampling leaves
the decoded sequence in it (reset it with `model.state = initial_state`
between sequences); `beam_search` leaves it unchanged.

Modules: `inspection` (modes, vocabularies, position budgets, argument
checks), `state_layout` (rows per example of the predict-mode state, from
the layers' declarations in `retrax.layers.predict_state`), `sampling`,
`beam_search`, and `decoder` (`Decoder`: a model's compiled programs).
"""

from retrax.supervised.decoding.beam_search import beam_search as beam_search
from retrax.supervised.decoding.decoder import Decoder as Decoder
from retrax.supervised.decoding.decoder import decoder_for as decoder_for
from retrax.supervised.decoding.decoder import reorder_examples as reorder_examples
from retrax.supervised.decoding.sampling import autoregressive_sample as autoregressive_sample
from retrax.supervised.decoding.sampling import (
    autoregressive_sample_stream as autoregressive_sample_stream)
