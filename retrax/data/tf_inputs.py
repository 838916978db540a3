"""Trax's `trax.data.tf_inputs` needs TensorFlow; importing it says what to use instead."""

from retrax.data import tensorflow_only

raise tensorflow_only.error('tf_inputs')
