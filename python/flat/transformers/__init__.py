"""flat as the CPU kernels of Hugging Face transformers' linear-attention models."""
