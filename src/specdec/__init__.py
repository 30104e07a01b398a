"""Speculative decoding from scratch behind one shared decoding contract."""
