"""ONNX: export of the trained encoders and the ONNX Runtime encoder the indexer and service run."""

# Items per graph call. A pretrained image backbone's activations grow with the batch: on 2 CPU
# cores (1 thread, 16 draws) EfficientNet-Lite0 took 23.8 ms a drawing in chunks of 256, 9.2 in
# chunks of 64 and 7.9 in chunks of 32, and MiniLM 3.4, 1.9 and 1.4 ms a caption.
ENCODE_BATCH = 32
