"""Keras: the one TensorFlow import, loading, the Keras 3 rebuild and graph rewrites."""
