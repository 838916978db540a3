from tensorflow.compat import v1, v2
