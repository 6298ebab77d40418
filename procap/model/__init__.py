"""The standard PyTorch ProCap model: VQGAN tokenizer, procedure encoder, caption decoder."""
