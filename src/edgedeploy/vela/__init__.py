"""Vela: argument lists and output parsers, the worker process, its pools and the compute analysis."""
