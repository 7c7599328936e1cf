"""The byte policy and what every policy shares: tokenizer.py (the byte tokenizer), policy.py (the byte
transformer, building a policy, scoring tokens), sampler.py (the byte policy's KV-cache sampler, and a
sampler's `Job`), checkpoint.py (saving and loading, the marker written last)."""
