"""Evaluation: retrieval and rejection metrics, the evaluation pipeline, its report and CLI."""
