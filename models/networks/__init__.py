"""The encoders: image and text trunks, Gaussian heads, tokenizer, preprocessing, config."""
