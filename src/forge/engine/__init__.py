"""The memory engine: `Memory` (the one write path), hybrid recall, fusion, rerank and embedders."""
