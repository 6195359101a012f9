"""Data: length-grouped batches, llm.c token shards and tokenizer files; torch.utils.data's
DataLoader, datasets and samplers (infinitrain.utils.data) are here too by their names."""
from ..utils.data import DataLoader, Dataset, DistributedSampler, TensorDataset
from .llmc import DataFormatError, Tokenizer, read_shard, write_shard, write_tokenizer
from .loader import LengthGroupedBatchSampler, TokenLoader

__all__ = ["Dataset", "TensorDataset", "DataLoader", "DistributedSampler", "TokenLoader", "read_shard", "write_shard",
           "Tokenizer", "write_tokenizer", "DataFormatError",
           "LengthGroupedBatchSampler"]
