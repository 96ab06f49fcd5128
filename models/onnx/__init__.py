"""ONNX: export of the trained encoders and the ONNX Runtime encoder the indexer and service run."""
