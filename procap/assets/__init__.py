"""Files shipped inside the package: the demo's tokenizer (procap.train.tokenizer)."""
