"""Data: map-style datasets and loaders, llm.c token shards and tokenizer files."""
from .llmc import DataFormatError, Tokenizer, read_shard, write_shard, write_tokenizer
from .loader import DataLoader, Dataset, DistributedSampler, TensorDataset, TokenLoader

__all__ = ["Dataset", "TensorDataset", "DataLoader", "DistributedSampler", "TokenLoader", "read_shard", "write_shard",
           "Tokenizer", "write_tokenizer", "DataFormatError"]
