"""The native engine: specbench's own batched, exact speculative decoding on transformers models,
with step-level timings. The reference every served engine is compared against."""
