"""Helpers the passes share (graph queries, shape inference rounds, static dims of dynamic shapes):
not passes themselves, so they live apart from the pass list's folder."""
